"""The package's version, in a module of its own so any part of the package (the CLI's
``--version``) can read it without importing the package root."""

__version__ = "0.1.0"
