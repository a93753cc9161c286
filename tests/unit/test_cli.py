"""The `sie` command line through its public surface: exit codes and what it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sie.cli.checks import EnvironmentProblem, check_onnxruntime_builds
from sie.cli.main import app

runner = CliRunner()


@pytest.fixture
def no_sie_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sie run` starts from no SIE_* variable (make exports SIE_MODEL_CACHE), so each test's are its own."""
    for name in [name for name in os.environ if name.startswith("SIE_")]:
        monkeypatch.delenv(name)


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("sie ")


def test_validate_baseline_catalogue(baseline_catalog_dir: Path) -> None:
    result = runner.invoke(app, ["catalog", "validate", str(baseline_catalog_dir)])
    assert result.exit_code == 0, result.output
    assert "1 bundles, 5 models" in result.output


def test_validate_defaults_to_the_settings_dirs(baseline_catalog_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("SIE_BUNDLES_DIR", str(baseline_catalog_dir / "bundles"))
    monkeypatch.setenv("SIE_MODELS_DIR", str(baseline_catalog_dir / "models"))
    assert runner.invoke(app, ["catalog", "validate"]).exit_code == 0


def test_validate_reports_each_error_with_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "bundles").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "bundles" / "b.yaml").write_text("name: b\nadapters: [a.mod]\n")
    (tmp_path / "models" / "x.yaml").write_text(
        "sie_id: org/x\nhf_id: org/x\nprofiles:\n  default: {adapter_path: 'z.mod:A'}\n"
    )
    result = runner.invoke(app, ["catalog", "validate", str(tmp_path)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert any("x.yaml: model 'org/x': profiles.default.max_batch_tokens" in line for line in lines)
    assert len(lines) == 1  # the unknown module is only reported for files that parse


def test_hashes_are_stable(baseline_catalog_dir: Path) -> None:
    first = runner.invoke(app, ["catalog", "hashes", str(baseline_catalog_dir)])
    second = runner.invoke(app, ["catalog", "hashes", str(baseline_catalog_dir)])
    assert first.exit_code == 0 and first.output == second.output
    assert "bundle default: " in first.output and "bundles_hash: " in first.output


def test_hashes_of_the_public_catalogue(public_catalog_dir: Path) -> None:
    result = runner.invoke(app, ["catalog", "hashes", str(public_catalog_dir)])
    assert "bundle default: 9729ccf4045feee1d8d7bb888bb42499091dbf52d9e2a409fa4a92d1162896de" in result.output
    assert "bundles_hash: 7d444c66818e44aa3ba47af7074c717222241eb565fa4b7a863c1046a8ceedd7" in result.output


def test_resolve(baseline_catalog_dir: Path) -> None:
    result = runner.invoke(
        app, ["catalog", "resolve", "sentence-transformers/all-minilm-l6-v2:int8", str(baseline_catalog_dir)]
    )
    assert result.exit_code == 0, result.output
    assert "model: sentence-transformers/all-MiniLM-L6-v2:int8" in result.output
    assert "profile: int8" in result.output
    assert "bundle: default" in result.output


def test_resolve_unknown_and_conflict(baseline_catalog_dir: Path) -> None:
    unknown = runner.invoke(app, ["catalog", "resolve", "acme/missing", str(baseline_catalog_dir)])
    assert unknown.exit_code == 1 and "Model 'acme/missing' not found" in unknown.output
    conflict = runner.invoke(app, ["catalog", "resolve", "candle:/rasyosef/splade-tiny", str(baseline_catalog_dir)])
    assert conflict.exit_code == 1 and "compatible bundles: ['default']" in conflict.output


def test_run_refuses_an_unknown_role(no_sie_variables: None) -> None:
    result = runner.invoke(app, ["run", "--role", "nope"])
    assert result.exit_code == 2
    assert "--role='nope' is not allowed; expected one of: gateway, config, sidecar, worker, all" in result.output


def test_run_refuses_an_unknown_flag(no_sie_variables: None) -> None:
    result = runner.invoke(app, ["run", "--role", "all", "--bogus", "1"])
    assert result.exit_code == 2 and "unknown option '--bogus'" in result.output


@pytest.mark.parametrize("role", ["gateway", "all"])
@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"SIE_AUTH_MODE": "token"}, "SIE_AUTH_MODE=token needs at least one inference token"),
        ({"SIE_AUTH_MODE": "static", "SIE_ADMIN_TOKEN": "adm"}, "SIE_ADMIN_TOKEN guards the admin routes only"),
        ({"SIE_AUTH_MODE": "token", "SIE_AUTH_TOKENS_FILE": "{empty}"}, "holds none"),
        ({"SIE_AUTH_MODE": "token", "SIE_AUTH_TOKENS": "t1", "SIE_AUTH_TOKENS_FILE": "{missing}"}, "cannot be read"),
    ],
)
def test_gateway_roles_refuse_auth_settings_they_cannot_serve(
    monkeypatch, no_sie_variables: None, tmp_path: Path, role: str, variables: dict[str, str], named: str
) -> None:
    """Token mode with no inference token, or a tokens file that cannot be read: exit 2 with the setting named,
    before anything starts (never serving open, never serving nobody)."""
    (tmp_path / "empty").write_text("# no tokens yet\n")
    for name, value in variables.items():
        monkeypatch.setenv(name, value.format(empty=tmp_path / "empty", missing=tmp_path / "missing"))
    result = runner.invoke(app, ["run", "--role", role])
    assert result.exit_code == 2, result.output
    assert named in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("role", ["gateway", "all"])
def test_gateway_roles_refuse_a_grpc_port_without_grpcio(monkeypatch, no_sie_variables: None, role: str) -> None:
    """SIE_GATEWAY_GRPC_PORT without the `grpc` extra: exit 2 naming the extra, before anything starts."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real_find_spec(name, *a)
    )
    monkeypatch.setenv("SIE_GATEWAY_GRPC_PORT", "8001")
    result = runner.invoke(app, ["run", "--role", role])
    assert result.exit_code == 2, result.output
    assert "pip install 'sie[grpc]'" in result.output and "Traceback" not in result.output


def test_run_refuses_a_flag_of_another_role(no_sie_variables: None) -> None:
    result = runner.invoke(app, ["run", "--role", "config", "--preload", "m"])
    assert result.exit_code == 2
    assert "option --preload does not apply to role 'config'; it is read by role worker, all" in result.output


def test_run_refuses_a_bad_setting(monkeypatch, no_sie_variables: None) -> None:
    monkeypatch.setenv("SIE_GATEWAY_REQUEST_TIMEOUT", "three")
    result = runner.invoke(app, ["run", "--role", "all"])
    assert result.exit_code == 2
    assert "SIE_GATEWAY_REQUEST_TIMEOUT" in result.output and "Traceback" not in result.output


def test_both_onnxruntime_builds_are_refused() -> None:
    with pytest.raises(EnvironmentProblem, match="pip uninstall -y onnxruntime onnxruntime-gpu"):
        check_onnxruntime_builds(lambda name: True)
    check_onnxruntime_builds(lambda name: name == "onnxruntime")


def test_sie_refuses_to_start_with_both_builds_installed(tmp_path: Path) -> None:
    """A real second distribution on the path, as `pip install onnxruntime-gpu` would leave it."""
    dist_info = tmp_path / "onnxruntime_gpu-1.31.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.31.1\n")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from sie.cli.main import main; "
        "sys.argv=['sie','run','--role','all']; main()"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Both onnxruntime and onnxruntime-gpu are installed" in result.stderr
