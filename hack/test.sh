#!/usr/bin/env bash
# Runs every test: formatting, lints, unit and property tests, CRD drift, and the integration
# tests against a real control plane (built from upstream Go modules on first use).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "control-plane binaries (cached after the first build)"
bash hack/k8s/build.sh >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (unit, property, CRD drift, integration against the real API server)"
# The demo and chart tests run the agent binary; build every binary first.
cargo build --workspace --bins
cargo test --workspace
