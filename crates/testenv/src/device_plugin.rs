//! A stand-in GPU device plugin for the real node, which has no GPU: it registers
//! `nvidia.com/gpu` with the kubelet through the device-plugin API (`v1beta1`), advertises
//! devices under the IDs NVIDIA's plugin uses (GPU UUIDs, here those of a recorded utilization
//! trace) and records what the kubelet allocates, so a test can check the kubelet's
//! pod-resources API against it. Nothing is mounted into the containers: no device exists.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::Status;

/// The kubelet's registration socket (fixed by the device-plugin API, whatever its root dir).
pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
/// The device-plugin API version this stand-in speaks.
pub const API_VERSION: &str = "v1beta1";

/// The kubelet's device-plugin API (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`), generated
/// from its vendored `.proto` (`vendor/kubelet/`) by `crates/tools/tests/kubelet_protos.rs`, which also
/// checks it for drift.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1beta1 {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../vendor/kubelet/rust/deviceplugin_v1beta1.rs"
    ));
}

use v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use v1beta1::registration_client::RegistrationClient;
use v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    Empty, ListAndWatchResponse, RegisterRequest,
};

/// A running stand-in plugin; stopping it (or dropping it) closes its socket, and the kubelet
/// then counts its devices as gone.
pub struct StandInDevicePlugin {
    socket: PathBuf,
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    stop: CancellationToken,
}

#[derive(Clone)]
struct Plugin {
    devices: Arc<Vec<String>>,
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    stop: CancellationToken,
}

type DeviceStream = tonic::codegen::BoxStream<ListAndWatchResponse>;

/// The three calls the kubelet makes of a plugin that asks for nothing more; the others answer
/// `unimplemented`.
#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<Empty>,
    ) -> Result<tonic::Response<DevicePluginOptions>, Status> {
        Ok(tonic::Response::new(DevicePluginOptions::default()))
    }

    /// The list once, then open until the plugin stops (the kubelet takes a closed stream for a
    /// plugin gone).
    async fn list_and_watch(
        &self,
        _: tonic::Request<Empty>,
    ) -> Result<tonic::Response<DeviceStream>, Status> {
        let list = ListAndWatchResponse {
            devices: self
                .devices
                .iter()
                .map(|id| Device {
                    id: id.clone(),
                    health: "Healthy".into(),
                    topology: None,
                })
                .collect(),
        };
        let stop = self.stop.clone();
        let stream: DeviceStream = Box::pin(futures::stream::unfold(Some(list), move |next| {
            let stop = stop.clone();
            async move {
                match next {
                    Some(list) => Some((Ok(list), None)),
                    None => {
                        stop.cancelled().await;
                        None
                    }
                }
            }
        }));
        Ok(tonic::Response::new(stream))
    }

    async fn allocate(
        &self,
        request: tonic::Request<AllocateRequest>,
    ) -> Result<tonic::Response<AllocateResponse>, Status> {
        let mut responses = Vec::new();
        for c in request.into_inner().container_requests {
            if let Some(bad) = c.devices_ids.iter().find(|id| !self.devices.contains(id)) {
                return Err(Status::invalid_argument(format!("unknown device {bad}")));
            }
            if let Ok(mut all) = self.allocations.lock() {
                all.push(c.devices_ids.clone());
            }
            responses.push(ContainerAllocateResponse {
                envs: [(
                    "NVIDIA_VISIBLE_DEVICES".to_string(),
                    c.devices_ids.join(","),
                )]
                .into(),
                ..Default::default()
            });
        }
        Ok(tonic::Response::new(AllocateResponse {
            container_responses: responses,
        }))
    }
}

/// Why the stand-in could not start.
#[derive(Debug, thiserror::Error)]
#[error("stand-in device plugin: {0}")]
pub struct DevicePluginError(String);

impl StandInDevicePlugin {
    /// Serves `devices` as `resource` on a socket of its own in the kubelet's device-plugin
    /// directory and registers with the kubelet.
    pub async fn start(
        resource: &str,
        devices: Vec<String>,
    ) -> Result<StandInDevicePlugin, DevicePluginError> {
        let dir = Path::new(KUBELET_SOCKET)
            .parent()
            .unwrap_or(Path::new("/"))
            .to_path_buf();
        let endpoint = format!("offload-stand-in-{}.sock", std::process::id());
        let socket = dir.join(&endpoint);
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|e| DevicePluginError(format!("binding {}: {e}", socket.display())))?;
        let stop = CancellationToken::new();
        let allocations = Arc::new(Mutex::new(Vec::new()));
        let plugin = Plugin {
            devices: Arc::new(devices),
            allocations: allocations.clone(),
            stop: stop.clone(),
        };
        let serving = stop.clone();
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(incoming, serving.cancelled_owned())
                .await
            {
                eprintln!("stand-in device plugin stopped: {e}");
            }
        });
        let running = StandInDevicePlugin {
            socket,
            allocations,
            stop,
        };
        register(&endpoint, resource).await?;
        Ok(running)
    }

    /// The device IDs of every container allocation so far, in order.
    pub fn allocations(&self) -> Vec<Vec<String>> {
        self.allocations
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default()
    }
}

impl Drop for StandInDevicePlugin {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `Registration.Register` on the kubelet's socket.
async fn register(endpoint: &str, resource: &str) -> Result<(), DevicePluginError> {
    let err = |what: &str, e: String| DevicePluginError(format!("{what} {KUBELET_SOCKET}: {e}"));
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(|_| async {
            let stream = tokio::net::UnixStream::connect(KUBELET_SOCKET).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }))
        .await
        .map_err(|e| err("connecting to", e.to_string()))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: Some(DevicePluginOptions::default()),
        })
        .await
        .map_err(|s| err("registering with", s.message().to_string()))?;
    Ok(())
}
