#!/usr/bin/env bash
# Install what tests/test_report_browser.py drives report.html with: a headless Chromium (Debian's `chromium`
# package, through apt-get as root) and puppeteer-core (npm, into ci/browser/node_modules, pinned). Idempotent and
# quick when both are present. Where either cannot be had (no root for apt-get, no npm), it says so and the test
# skips with the reason; KVGATE_CHROMIUM may name another Chromium binary.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
puppeteer_core="24.43.1"
chromium="${KVGATE_CHROMIUM:-$(command -v chromium || true)}"
if [[ -z "$chromium" ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    chromium="$(command -v chromium)"
  else
    echo "install_browser.sh: no chromium, and apt-get needs root: the browser test will skip" >&2
  fi
fi
if [[ ! -f "$here/browser/node_modules/puppeteer-core/package.json" ]]; then
  if command -v npm >/dev/null; then
    npm install --prefix "$here/browser" --no-audit --no-fund --silent "puppeteer-core@$puppeteer_core"
  else
    echo "install_browser.sh: no npm for puppeteer-core: the browser test will skip" >&2
  fi
fi
[[ -n "$chromium" ]] && "$chromium" --version 2>/dev/null | head -1 || true
