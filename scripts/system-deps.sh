#!/usr/bin/env bash
# What the tests need beyond Python packages: Chromium (the report's browser test) and a PostgreSQL server (the
# parallel-trials test starts its own on loopback). Installs what is missing where it can (apt-get as root;
# PostgreSQL otherwise as the pgserver wheel into the venv) and says exactly what it could not.
# Usage: scripts/system-deps.sh VENV_BIN. Exit 0 always: a test that lacks its dependency says so itself.
# SYSTEM_ROOT (default /) is where the packages' files are looked for: its tests point it elsewhere.
set -uo pipefail
bin=$1
root=${SYSTEM_ROOT:-}
has_chromium() { [ -x "$root/usr/bin/chromium" ]; }  # where tests/integration/test_report_browser.py looks
has_postgres() {
  compgen -G "$root/usr/lib/postgresql/*/bin/initdb" >/dev/null ||
    "$bin/python" -c 'import pgserver' 2>/dev/null
}
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

missing=()
has_chromium || missing+=(chromium)
has_postgres || missing+=(postgresql)
[ ${#missing[@]} -eq 0 ] && exit 0
if can_apt; then
  echo "system-deps: installing ${missing[*]} with apt-get"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    echo "system-deps: apt-get install ${missing[*]} failed"
fi
if ! has_postgres; then
  echo "system-deps: installing PostgreSQL as the pgserver wheel into $bin/.."
  "$bin/pip" install -q 'pgserver==0.1.4' 2>&1 | grep -v 'is ignored: it is neither' ||
    true
fi
has_chromium || echo "system-deps: chromium is missing and could not be installed ($(can_apt && echo 'apt-get did not install it' \
  || echo 'not root, or no apt-get')): the report's browser test will be SKIPPED; install Debian's chromium package"
has_postgres || echo "system-deps: no PostgreSQL server (Debian's postgresql, or pip's pgserver) could be installed:" \
  "the parallel-trials test will FAIL; install Debian's postgresql package"
exit 0
