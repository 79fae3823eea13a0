"""The local runtime's error types: one base, and what can go wrong getting an image and unpacking it."""


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


class ImageLayerError(ImageSourceError):
    """A layer holds what the host must not unpack (a path out of the root, a device node), or is corrupt."""


class ImageTooLargeError(ImageSourceError):
    """The image decompresses past the limit (a bomb), has too many entries, or would not fit on the disk."""


class ImageConfigError(ImageSourceError):
    """The image's config names a working directory or User that cannot be one (`..`, an unknown name)."""


class ImageUnpackError(ImageSourceError):
    """umoci failed to unpack layers the checks let through; its message is kept."""
