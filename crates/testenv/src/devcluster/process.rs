//! Child processes that die with the process that started them, and free ports.

use std::io;
use std::net::TcpListener;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use super::{DevClusterError, io_err};

/// Spawns children from one thread that lives as long as the process, so `PR_SET_PDEATHSIG`
/// (which fires when the spawning *thread* exits) only fires when the process does.
pub(crate) fn spawn(mut cmd: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("devcluster-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
                    unsafe {
                        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map(|_| ())
            .ok();
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    let send = sender
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .send((cmd, tx));
    match send {
        Ok(()) => rx
            .recv()
            .map_err(|_| io::Error::other("spawner thread is gone"))?,
        Err(mpsc::SendError((c, _))) => {
            cmd = c;
            cmd.spawn()
        }
    }
}

/// The lowest port [`free_port`] hands out: below it lie the well-known and registered ports
/// that other services on the machine may expect.
const LOWEST_PORT: u16 = 20_000;

/// A free TCP port on 127.0.0.1 for a component to listen on, outside the kernel's ephemeral
/// range (`net.ipv4.ip_local_port_range`) and never the same twice in one process.
///
/// The port is only checked, not held: a component binds it after this returns. A port from
/// the ephemeral range (what `bind(…:0)` gives) can be taken in between by any outgoing
/// connection on the machine — an etcd that could not bind its client port stopped a test
/// run that way — so the port is drawn from below that range, where the kernel never picks
/// one on its own. Test processes running side by side still draw from the same range;
/// [`super::DevCluster::start`] starts again where a component lost its port all the same.
pub fn free_port() -> Result<u16, DevClusterError> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let (ephemeral_low, _) = ephemeral_range();
    let highest = ephemeral_low.saturating_sub(1);
    if highest > LOWEST_PORT {
        let span = u64::from(highest - LOWEST_PORT) + 1;
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for attempt in 0..256u64 {
            let offset = u16::try_from(random_u64(attempt) % span).unwrap_or(0);
            let port = LOWEST_PORT + offset;
            if given.contains(&port) {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return Ok(port);
            }
        }
    }
    // No room below the ephemeral range (or all of it busy): the kernel's choice.
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io_err("finding a free port"))?
        .port())
}

/// The kernel's ephemeral port range; Linux's default where it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut fields = text.split_whitespace().map(str::parse::<u16>);
            Some((fields.next()?.ok()?, fields.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999))
}

/// A random number from the standard library's per-process random hash keys, mixed with the
/// time, the process and `salt`: enough to spread ports across test processes.
fn random_u64(salt: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(salt);
    hasher.write_u32(std::process::id());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_outside_the_ephemeral_range_and_never_repeat() {
        let (low, high) = ephemeral_range();
        if low <= LOWEST_PORT + 1_000 {
            eprintln!("skipped: the ephemeral range {low}-{high} leaves no room below it");
            return;
        }
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        for port in &ports {
            assert!(
                *port < low || *port > high,
                "port {port} lies in the ephemeral range {low}-{high}"
            );
        }
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "a port was handed out twice");
    }

    #[test]
    fn a_component_that_lost_its_port_is_told_from_other_failures() {
        let not_ready = |tail: &str| DevClusterError::NotReady {
            component: "etcd",
            waited: std::time::Duration::from_millis(60),
            log: "etcd.log".into(),
            tail: tail.into(),
        };
        let lost = r#"{"level":"fatal","msg":"discovery failed","error":"listen tcp 127.0.0.1:34799: bind: address already in use"}"#;
        assert!(not_ready(lost).lost_a_port());
        assert!(!not_ready("panic: storage is corrupt").lost_a_port());
        assert!(!DevClusterError::Client("address already in use".into()).lost_a_port());
    }
}
