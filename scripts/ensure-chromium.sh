#!/bin/sh
# Make sure Debian's chromium is installed for the dashboard browser test (tests/e2e/test_gateway_dashboard.py).
# Called by `make test`. Never downloads a browser through Playwright (`playwright install`): the test
# drives the system chromium by executable_path. On a system without apt, or without the rights to
# install, it says so and returns 0: the browser test then skips with that reason.
set -u
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: no apt-get here; install chromium yourself to run the dashboard browser test" >&2
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  echo "ensure-chromium: not root and no passwordless sudo; run 'apt-get install -y chromium' as root" >&2
  exit 0
fi
echo "ensure-chromium: installing Debian's chromium (once)" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends chromium >/dev/null \
  || { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y --no-install-recommends chromium >/dev/null; } \
  || echo "ensure-chromium: apt-get could not install chromium; the browser test will skip" >&2
exit 0
