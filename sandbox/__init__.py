"""Bubblewrap sandboxes whose whole world is one session's mount: issue 4."""
