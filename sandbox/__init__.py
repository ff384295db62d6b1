"""Starting and stopping session mounts (``mounts``); bubblewrap sandboxes
whose whole world is one session's mount arrive with issue 4."""
