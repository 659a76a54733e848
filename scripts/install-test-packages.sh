#!/usr/bin/env bash
# Installs the Debian packages some tests use, if they are not there yet: chromium (the dashboard's
# browser test, tests/cluster/test_browser.py), bubblewrap (the sandboxed-runtime example and its test,
# tests/cluster/test_isolation.py), prometheus (its `prometheus` and `promtool`: the alert rules' unit
# tests and a real Prometheus scraping a local cluster, tests/cluster/test_prometheus.py), postgresql (the
# history store's second backend: synapse/local/postgres.py starts a throwaway server from its
# binaries; the package's own cluster is not used), python3-torch (the PyTorch examples,
# tests/cluster/test_examples_torch.py), and for container images (tests/cluster/test_image_*.py, bench/images.py)
# docker-registry (a real registry the tests push to and pull from), skopeo and umoci (the
# reference tools the unpacker is compared with), runc and busybox-static (a static busybox the
# tests' images are built from, and a runtime to run them). The distribution's packages only, never a downloaded build, and one
# apt-get update for all. Where they cannot be installed (no root, no apt), it says why and exits
# 0: those tests then skip with that reason.
set -u
missing=()
for pair in chromium:chromium bwrap:bubblewrap prometheus:prometheus promtool:prometheus \
            docker-registry:docker-registry skopeo:skopeo umoci:umoci runc:runc; do  # command:package
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
# Debian keeps PostgreSQL's server binaries off PATH, under /usr/lib/postgresql/VERSION/bin.
command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
# The tests copy busybox into images that have nothing else, so it must be the static build.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" || missing+=(busybox-static)
# Debian's torch (CPU) for the PyTorch examples and their tests (tests/cluster/test_examples_torch.py), for
# the system interpreter: the tests run the examples with it when the test interpreter lacks torch.
/usr/bin/python3 -c "import torch" >/dev/null 2>&1 || missing+=(python3-torch)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "${#missing[@]}" -eq 0 ] || [ -z "${missing[0]}" ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-packages: not root or no apt-get; the tests that need ${missing[*]} will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
log=/tmp/install-test-packages.log
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  echo "install-test-packages: apt-get failed (see $log); the tests that need ${missing[*]} will skip" >&2
fi
exit 0
