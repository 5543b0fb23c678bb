#!/bin/sh
# One-shot MinIO setup for the compose topology (runs in the minio/mc image):
#   - creates the bucket $S3_BUCKET (idempotent);
#   - creates a read-only user $S3_READONLY_ACCESS_KEY with a policy allowing only
#     ListBucket/GetBucketLocation on the bucket and GetObject inside it.
# The provisioner worker gets that read-only key: its object-store step is a HEAD on the
# bucket and it never writes. Only this job holds the MinIO root credentials.
set -eu

: "${MINIO_ENDPOINT:=http://minio:9000}"
: "${MINIO_ROOT_USER:?set MINIO_ROOT_USER}"
: "${MINIO_ROOT_PASSWORD:?set MINIO_ROOT_PASSWORD}"
: "${S3_BUCKET:?set S3_BUCKET}"
: "${S3_READONLY_ACCESS_KEY:?set S3_READONLY_ACCESS_KEY}"
: "${S3_READONLY_SECRET_KEY:?set S3_READONLY_SECRET_KEY}"
policy_name="${S3_BUCKET}-readonly"

# The root alias is passed through the environment (MC_HOST_<alias>), never on a command line.
# Shell expansions only: the mc image has no sed or awk.
MC_HOST_local="${MINIO_ENDPOINT%%://*}://${MINIO_ROOT_USER}:${MINIO_ROOT_PASSWORD}@${MINIO_ENDPOINT#*://}"
export MC_HOST_local

tries=0
until mc ready local >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -ge 60 ]; then
    echo "minio-init: MinIO at $MINIO_ENDPOINT is not ready after 60 s" >&2
    exit 1
  fi
  sleep 1
done

mc mb --ignore-existing "local/${S3_BUCKET}"

policy_file="${TMPDIR:-/tmp}/${policy_name}.json"
cat >"$policy_file" <<JSON
{
  "Version": "2012-10-17",
  "Statement": [
    {
      "Effect": "Allow",
      "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
      "Resource": ["arn:aws:s3:::${S3_BUCKET}"]
    },
    {
      "Effect": "Allow",
      "Action": ["s3:GetObject"],
      "Resource": ["arn:aws:s3:::${S3_BUCKET}/*"]
    }
  ]
}
JSON
mc admin policy create local "$policy_name" "$policy_file"
rm -f "$policy_file"

mc admin user add local "$S3_READONLY_ACCESS_KEY" "$S3_READONLY_SECRET_KEY" >/dev/null
if ! out="$(mc admin policy attach local "$policy_name" --user "$S3_READONLY_ACCESS_KEY" 2>&1)"; then
  case "$out" in
    *"already in effect"*) ;;  # re-run: the policy is attached already
    *) echo "$out" >&2; exit 1 ;;
  esac
fi
echo "minio-init: bucket '${S3_BUCKET}' ready; read-only user '${S3_READONLY_ACCESS_KEY}' attached to '${policy_name}'"
