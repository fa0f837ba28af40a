"""The writer: the bucket-lease lifecycle around fenced snapshots (``backup now``), and the
service (``run``) with its triggers, systemd notifications and metrics."""
