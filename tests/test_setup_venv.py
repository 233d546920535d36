"""tools/setup_venv.py: pip's configuration passed on to uv, with pip's precedence."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_venv():
    spec = importlib.util.spec_from_file_location("setup_venv", ROOT / "tools" / "setup_venv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pip_settings_reach_uv_with_the_environment_winning_over_the_config_file(tmp_path, monkeypatch):
    config = tmp_path / "pip.conf"
    config.write_text(  # [install] outranks the [global] sections of this machine's own pip files
        "[install]\n"
        "index-url = https://mirror.example/simple\n"
        "extra-index-url = file:///opt/a/simple file:///opt/b/simple\n"
        "find-links = /opt/config-wheels\n"
        "constraint = /etc/pins.txt\n"
        "cert = /etc/ssl/bundle.pem\n"
        "trusted-host = mirror.example\n"
        "timeout = 60\n"
    )
    for name in list(__import__("os").environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/env-wheels")  # pip: the environment replaces the file's value
    setup_venv = _setup_venv()

    settings = setup_venv.pip_settings(sys.executable)
    assert settings["find-links"] == ["/opt/env-wheels"]
    assert settings["extra-index-url"] == ["file:///opt/a/simple", "file:///opt/b/simple"]

    arguments, environment = setup_venv.uv_arguments(settings)
    pairs = list(zip(arguments[::2], arguments[1::2], strict=True))
    expected = [
        ("--index-strategy", "unsafe-best-match"),
        ("--index-url", "https://mirror.example/simple"),
        ("--extra-index-url", "file:///opt/a/simple"),
        ("--extra-index-url", "file:///opt/b/simple"),
        ("--find-links", "/opt/env-wheels"),
        ("--constraint", "/etc/pins.txt"),
        ("--allow-insecure-host", "mirror.example"),
    ]
    assert [pair for pair in pairs if pair in expected] == expected
    assert ("--find-links", "/opt/config-wheels") not in pairs
    assert environment == {"SSL_CERT_FILE": "/etc/ssl/bundle.pem"}
    assert not any("timeout" in argument for argument in arguments)  # no uv equivalent: left out


def test_no_index_is_passed_on(monkeypatch, tmp_path):
    config = tmp_path / "pip.conf"
    config.write_text("[install]\nno-index = true\nfind-links = /opt/wheels\n")
    for name in list(__import__("os").environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    setup_venv = _setup_venv()
    arguments, _ = setup_venv.uv_arguments(setup_venv.pip_settings(sys.executable))
    assert "--no-index" in arguments and arguments[arguments.index("--find-links") + 1] == "/opt/wheels"
