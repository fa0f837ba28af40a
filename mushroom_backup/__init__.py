"""mushroom-backup: fenced, deduplicated, verified backups of a data directory to S3-compatible
storage or a local directory. See README.md for the user's view and DESIGN.md for the map."""

__version__ = "0.1.0"
