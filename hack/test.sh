#!/usr/bin/env bash
# Runs every test: the README's first command from this clone as a newcomer meets it, then
# formatting, lints, unit and property tests, CRD drift, and the integration tests against a real
# control plane (built from upstream Go modules on first use).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "hack/demo.sh: the README's first command, before anything else has built"
bash hack/demo.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (unit, property, CRD drift, integration against the real API server)"
cargo test --workspace
