//! Debian's nginx (`/usr/sbin/nginx`, `apt-get install nginx-light`) in a pod: the ingress
//! controller the ingress-mode tests put in front of the mesh, as a real cluster would.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Netns;

pub use cnimesh_local::nginx::{NGINX, location};

/// nginx in the foreground in a pod, with its own prefix directory; stopped when dropped.
pub struct Nginx {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// nginx in `netns`, serving `server` (the body of one `server { }` block: its
    /// [`location`]s) on `listen`, which it must accept on within ten seconds. Panics when
    /// nginx is not installed, so a test host without it fails rather than skips.
    pub fn start(netns: &Netns, listen: std::net::SocketAddr, server: &str) -> anyhow::Result<Self> {
        assert!(Path::new(NGINX).exists(), "{NGINX} is missing: apt-get install nginx-light (scripts/setup.sh)");
        let dir = tempfile::tempdir()?;
        let conf = cnimesh_local::nginx::config(dir.path(), &cnimesh_local::nginx::server(listen, None, server));
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf)?;
        let child = Command::new("ip")
            .args(["netns", "exec", netns.name(), NGINX, "-e", "stderr", "-p"])
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let nginx = Self { child, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while cnimesh_cni::netns::run_in(&netns.path(), move || std::net::TcpStream::connect(listen))?.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "nginx never listened on {listen}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(nginx)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
