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

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16, DevClusterError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io_err("finding a free port"))?
        .port())
}
