"""Sessions whose whole world is one mount: the mount servers (``mounts``,
``server``), the bubblewrap sandbox around a command (``launch``, ``bwrap``,
``seccomp``) and the host uids they run as (``uids``)."""
