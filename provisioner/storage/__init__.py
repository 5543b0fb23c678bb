"""Object-store readiness checks behind one small interface; the only importer of cloud SDKs.

The provisioner never writes to object storage: each store answers "is the tenant's bucket,
container or directory there and readable?" (see :mod:`provisioner.storage.base`).

* :mod:`~provisioner.storage.base` - the ``ObjectStore`` Protocol, timeouts, secret-free errors,
  the installed-extra check;
* :mod:`~provisioner.storage.filesystem` - a local directory (the embedded default, no extra);
* :mod:`~provisioner.storage.s3` - ``HeadBucket`` through boto3 (extra ``[s3]``);
* :mod:`~provisioner.storage.azure` - ``Get Container Properties`` through azure-storage-blob
  (extra ``[azure]``);
* :mod:`~provisioner.storage.factory` - ``store_from_settings`` and ``readiness`` (the check the
  heartbeat and ``health --check-storage`` report).

Importing this package imports neither boto3 nor azure: they are optional extras, and a
provider whose library is missing is refused with one line naming the extra
(``OBJECT_STORE_PROVIDER=s3 needs boto3: pip install 'pg-tenant-provisioner[s3]'``).
"""

from provisioner.settings import AZURE_CREDENTIAL_ENV
from provisioner.storage.azure import AzureBlobStore
from provisioner.storage.base import CONNECT_TIMEOUT, READ_TIMEOUT, ObjectStore
from provisioner.storage.factory import Readiness, readiness, store_from_settings
from provisioner.storage.filesystem import FilesystemStore
from provisioner.storage.none import NoStore
from provisioner.storage.s3 import S3_ADDRESSING_STYLES, S3Store

__all__ = [
    "AZURE_CREDENTIAL_ENV",
    "CONNECT_TIMEOUT",
    "READ_TIMEOUT",
    "S3_ADDRESSING_STYLES",
    "AzureBlobStore",
    "FilesystemStore",
    "NoStore",
    "ObjectStore",
    "Readiness",
    "S3Store",
    "readiness",
    "store_from_settings",
]
