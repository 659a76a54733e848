#!/usr/bin/env bash
# Installs Debian's chromium for the dashboard's browser test (tests/test_browser.py), if it is not
# there yet. Never a downloaded browser build: the distribution's package only. Where it cannot be
# installed (no root, no apt), it says why and exits 0: the browser test then skips with that reason.
set -u
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: not root or no apt-get; the browser test will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; } >/tmp/install-chromium.log 2>&1; then
  echo "install-chromium: apt-get failed (see /tmp/install-chromium.log); the browser test will skip" >&2
fi
exit 0
