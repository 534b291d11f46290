//! The test environment of offload-operator: never part of a release binary.
//!
//! - [`deploy`]: the chart installed with the images built here, on a cluster with a real node;
//! - [`devcluster`]: a local Kubernetes control plane made of the real upstream binaries
//!   (etcd, kube-apiserver, controller-manager, scheduler, kwok), built from their Go modules;
//! - [`device_plugin`]: a stand-in GPU device plugin for the real node (it has no GPU);
//! - [`dra`]: a stand-in for NVIDIA's DRA driver: its ResourceSlices and DeviceClass;
//! - [`http`]: the admin server's GETs, a webhook's TLS POSTs, metrics text parsed;
//! - [`pki`]: the certificates it runs on (admin client certificate, service-account keys);
//! - [`fixtures`]: recorded node reports, stand-ins for hardware that is not here;
//! - [`support`]: helpers for integration tests (one cluster per test binary, a namespace per
//!   test, waits on conditions, kwok nodes, the operator in process).
#![deny(missing_docs)]

pub mod deploy;
pub mod devcluster;
pub mod device_plugin;
pub mod dra;
pub mod fixtures;
pub mod http;
pub mod pki;
pub mod support;
