"""Sandbox images: sources (SIF, directories, OCI layouts and archives) and the content-addressed
cache that makes them runnable."""

from rollserve.images.base import ImageConfig, ImageSource, Located, RunnableImage
from rollserve.images.cache import CachedImage, ImageCache
from rollserve.images.store import ImageStore, default_sources

__all__ = [
    "CachedImage",
    "ImageCache",
    "ImageConfig",
    "ImageSource",
    "ImageStore",
    "Located",
    "RunnableImage",
    "default_sources",
]
