"""The installed distribution's version, in a leaf module: the CLI and the worker's heartbeat show
it, and nothing below the package root should need to import the root to read it."""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "pg-tenant-provisioner"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
