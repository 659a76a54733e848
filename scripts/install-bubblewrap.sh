#!/usr/bin/env bash
# Installs Debian's bubblewrap (bwrap), the sandbox the README's external-runtime example and its
# test (tests/test_isolation.py) use, if it is not there yet. The distribution's package only.
# Where it cannot be installed (no root, no apt), it says why and exits 0: that test then skips.
set -u
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-bubblewrap: not root or no apt-get; the sandbox test will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap; } >/tmp/install-bubblewrap.log 2>&1; then
  echo "install-bubblewrap: apt-get failed (see /tmp/install-bubblewrap.log); the sandbox test will skip" >&2
fi
exit 0
