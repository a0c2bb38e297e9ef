"""The package version, in a leaf: every module may import it without importing the package face."""

__all__ = ["__version__"]

__version__ = "0.6.0"
