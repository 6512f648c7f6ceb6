"""The README's two commands on a machine seen for the first time (issue 17 item 10): `./run-tests` and
`./dashboard` each prepare the environment themselves, CI calls exactly the test command.

The first-use path is run for real into a temporary environment (made with --system-site-packages, so the packages
this interpreter already has are reused and nothing is downloaded) or, when the tests already run inside the
environment ./run-tests made, through that environment (the 'already prepared' path)."""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from servers import free_port, wait_until_served

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_env(tmp_path_factory) -> dict:
    """The environment the two commands run with: the virtual environment these tests run in, or a fresh one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    if sys.prefix != sys.base_prefix:  # inside a virtual environment (./run-tests): use it as it is
        env["DSOCR_VENV"] = sys.prefix
    else:
        env["DSOCR_VENV"] = str(tmp_path_factory.mktemp("setup") / "venv")
        env["PYTHON"] = sys.executable
    return env


def test_ci_runs_exactly_the_readme_test_command():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.strip().startswith("#")]
    assert lines[-1] == "exec ./run-tests"
    readme = (ROOT / "README.md").read_text()
    assert "./run-tests" in readme and "./dashboard" in readme
    for script in ("run-tests", "dashboard", ".ci/run"):
        path = ROOT / script
        assert os.access(path, os.X_OK), script
        subprocess.run(["bash", "-n", str(path)], check=True)
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "setup-env.sh")], check=True)


def test_run_tests_prepares_the_environment_and_runs_pytest(setup_env):
    env = setup_env
    out = subprocess.run(["./run-tests", "-q", "-p", "no:cacheprovider", "tests/test_spec.py"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert " passed" in out.stdout
    assert (Path(env["DSOCR_VENV"]) / ".dsocr-setup").exists()
    failing = subprocess.run(["./run-tests", "-q", "-p", "no:cacheprovider", "tests/test_spec.py", "-k",
                              "no_such_test_anywhere"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600, stdin=subprocess.DEVNULL)
    assert failing.returncode != 0  # pytest's status comes back (5: nothing collected)


def test_dashboard_prepares_the_environment_and_serves_the_app(setup_env, tmp_path):
    env = dict(setup_env)
    env["DSOCR_STORE"] = str(tmp_path / "runs.sqlite")
    port = free_port()
    log = open(tmp_path / "dashboard.log", "w")
    proc = subprocess.Popen(["./dashboard", "--server.port", str(port), "--server.fileWatcherType", "none"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_until_served(proc, f"http://127.0.0.1:{port}", tmp_path / "dashboard.log", 600, "./dashboard")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200
    finally:
        os.killpg(proc.pid, 15)  # the session this test started: the script and the streamlit it exec'd
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


def test_an_unreachable_wheel_index_is_one_line_not_twenty_retries(tmp_path):
    """First use on a machine without a GPU tries PyTorch's CPU index: unreachable, pip retried 5 times per request
    and printed about 20 'Retrying ... Name or service not known' lines before the fallback. One try, one line."""
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    "echo \"$@\" >> \"$(dirname \"$0\")/calls\"\n"
                    "for i in 1 2 3 4 5; do echo \"WARNING: Retrying (Retry(total=$i)) after connection broken by "
                    "NewConnectionError: [Errno -2] Name or service not known\" >&2; done\n"
                    "exit 1\n")
    fake.chmod(0o755)
    script = (f'source "{ROOT}/scripts/setup-env.sh"; PY="{fake}"; '
              "_pip_from_index torch==0 https://unreachable.invalid/x")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.splitlines() == ["[setup] https://unreachable.invalid/x is unreachable; installing torch==0 "
                                       "from the default index instead"], out.stderr
    assert "--retries 0" in (tmp_path / "calls").read_text()


def test_the_served_app_watches_no_files_and_offers_no_deploy_button():
    """The file watcher over the project folder and its .venv printed 'Inotify queue overflowed' 14,106 times in
    30 minutes; a local tool has no use for Streamlit's Deploy button."""
    code = ("import streamlit.config as c; c.get_config_options(force_reparse=True); "
            "print(c.get_option('server.fileWatcherType'), c.get_option('client.toolbarMode'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["none", "minimal"], out.stdout + out.stderr
