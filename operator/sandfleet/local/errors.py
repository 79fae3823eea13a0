"""The local runtime's error types: one base, and what can go wrong getting an image from where it is kept."""


class LocalRuntimeError(Exception):
    """Something the local runtime could not do; the message says what and why."""


class ImageSourceError(LocalRuntimeError):
    """An image could not be had from where it is kept (registry, archive, layout); says what to do."""


class ImageNotFoundError(ImageSourceError):
    """The image, its repository, tag or archive does not exist."""


class RegistryAuthError(ImageSourceError):
    """The registry refused the credentials (401/403), or wanted some and none were given."""


class RegistryUnavailableError(ImageSourceError):
    """The registry answered 429 or 5xx, or could not be reached, and went on doing so through every retry."""


class RegistryTrustError(ImageSourceError):
    """The registry's TLS certificate is not trusted (no CA for it in the certificate directory)."""


class ImagePlatformError(ImageSourceError):
    """The image is not for linux/amd64: an index with no such entry, or a single image of another arch."""


class ImageArchiveError(ImageSourceError):
    """An oci-archive or docker-archive is corrupt or truncated, or a blob does not match its digest."""
