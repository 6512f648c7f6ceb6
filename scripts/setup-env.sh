# Sourced by ./dashboard and ./run-tests: prepares what they need on first use, then does nothing more.
#
#   dsocr_env        a Python >= 3.11 virtual environment with requirements.txt ($DSOCR_VENV, default .venv; made
#                    with --system-site-packages, so packages the machine already has are reused); redone only when
#                    requirements.txt or the Python changes. Sets $PY to its python.
#   dsocr_chromium   Debian's Chromium for the browser tests (apt-get, as root or with password-less sudo); where it
#                    cannot be installed, sets DSOCR_BROWSER_SKIP_REASON, which the browser tests print when skipped.
#
# torch is pinned (torch==2.13.0). On a machine without an NVIDIA GPU it comes from PyTorch's CPU wheel index
# (falling back to the ordinary index); a GPU machine gets the ordinary (CUDA) wheel or keeps the build it has.

DSOCR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DSOCR_VENV="${DSOCR_VENV:-$DSOCR_ROOT/.venv}"
TORCH_PIN="$(grep -E '^torch==' "$DSOCR_ROOT/requirements.txt" | head -n 1)"

_say() { printf '[setup] %s\n' "$*" >&2; }

_as_root() {  # run a command as root, or fail
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo -n "$@"
  else return 1
  fi
}

_apt_install() {  # apt-get install, refreshing the package lists once if the first try fails
  command -v apt-get >/dev/null 2>&1 || return 1
  export DEBIAN_FRONTEND=noninteractive
  _as_root apt-get install -y -qq "$@" </dev/null >/dev/null 2>&1 && return 0
  _as_root apt-get update -qq </dev/null >/dev/null 2>&1 || return 1
  _as_root apt-get install -y -qq "$@" </dev/null >/dev/null 2>&1
}

_has_gpu() {
  [ -e /dev/nvidiactl ] || [ -e /dev/nvidia0 ] || [ -e /proc/driver/nvidia/version ]
}

_pip_from_index() {  # pip install $1 from the index $2, one try: unreachable, it says so in one line and fails
  # (pip's own retries print about 20 'Retrying ... Name or service not known' lines before the fallback)
  local log
  log="$(mktemp)"
  if "$PY" -m pip install -q --retries 0 --timeout 15 "$1" --index-url "$2" >"$log" 2>&1; then
    rm -f "$log"
    return 0
  fi
  if grep -qiE "name or service not known|connection|timed out|temporary failure|network is unreachable" "$log"
  then _say "$2 is unreachable; installing $1 from the default index instead"
  else cat "$log" >&2
  fi
  rm -f "$log"
  return 1
}

dsocr_env() {
  local base="${PYTHON:-python3}"
  if ! command -v "$base" >/dev/null 2>&1; then
    _say "no $base on this machine; install Python 3.11 or newer (Debian: apt-get install python3 python3-venv)"
    return 1
  fi
  if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    _say "$("$base" --version 2>&1) is too old: Python 3.11 or newer is needed (set PYTHON=/path/to/python3.11)"
    return 1
  fi
  local stamp
  stamp="$( (cat "$DSOCR_ROOT/requirements.txt"; "$base" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
  PY="$DSOCR_VENV/bin/python"
  if [ -x "$PY" ] && [ "$(cat "$DSOCR_VENV/.dsocr-setup" 2>/dev/null)" = "$stamp" ]; then
    return 0  # set up before, with these requirements
  fi
  _say "preparing $DSOCR_VENV (first use, or requirements.txt changed) ..."
  if [ ! -x "$PY" ]; then
    if ! "$base" -m venv --system-site-packages "$DSOCR_VENV" >/dev/null 2>&1; then
      rm -rf "$DSOCR_VENV"
      _say "python's venv module is missing; installing Debian's python3-venv"
      if ! _apt_install python3-venv || ! "$base" -m venv --system-site-packages "$DSOCR_VENV"; then
        _say "cannot create a virtual environment: install python3-venv (as root: apt-get install python3-venv)"
        return 1
      fi
    fi
  fi
  if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${TORCH_PIN#torch==}')" \
      >/dev/null 2>&1; then
    if _has_gpu; then
      _say "installing $TORCH_PIN (CUDA build) ..."
      "$PY" -m pip install -q "$TORCH_PIN" || return 1
    else
      _say "installing $TORCH_PIN (CPU build: no NVIDIA GPU here) ..."
      _pip_from_index "$TORCH_PIN" https://download.pytorch.org/whl/cpu || "$PY" -m pip install -q "$TORCH_PIN" \
        || return 1
    fi
  fi
  _say "installing requirements.txt ..."
  "$PY" -m pip install -q -r "$DSOCR_ROOT/requirements.txt" || return 1
  echo "$stamp" > "$DSOCR_VENV/.dsocr-setup"
  _say "ready: $("$PY" --version 2>&1) in $DSOCR_VENV"
}

dsocr_chromium() {
  [ -x /usr/bin/chromium ] && return 0
  _say "installing Debian's Chromium for the browser tests (never a downloaded browser) ..."
  if ! command -v apt-get >/dev/null 2>&1; then
    export DSOCR_BROWSER_SKIP_REASON="no apt-get on this machine to install Debian's chromium"
  elif ! _as_root true 2>/dev/null; then
    export DSOCR_BROWSER_SKIP_REASON="installing Debian's chromium needs root (or password-less sudo)"
  elif ! _apt_install chromium || [ ! -x /usr/bin/chromium ]; then
    export DSOCR_BROWSER_SKIP_REASON="apt-get could not install chromium (offline, or no such package here)"
  else
    return 0
  fi
  _say "browser tests will be skipped: $DSOCR_BROWSER_SKIP_REASON"
}
