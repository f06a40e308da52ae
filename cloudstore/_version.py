"""The release's version, in a module of its own: pyproject reads it without importing the package
(``[tool.setuptools.dynamic]``), and the drivers print it (``--version``) without importing the package's root."""

__version__ = "0.8.0"
