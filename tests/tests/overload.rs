//! The inbound proxy under connection floods and slow clients, on a real kernel: a
//! captured server pod with its proxy and the test apps; unmeshed pods flood it or send normal
//! requests, straight to the server pod's address (so only the inbound capture sees them).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

/// Server pod with apps and its proxy, and `sources` unmeshed client pods.
struct Setup<'n> {
    server: Pod<'n>,
    apps: Apps,
    proxy: Sidecar,
    clients: Vec<Pod<'n>>,
}

impl Setup<'_> {
    fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.server.ipv4().into(), port)
    }

    /// `n` HTTP/1 requests from client `i`, each on a new connection; their statuses.
    fn requests(&self, i: usize, n: usize) -> Vec<u16> {
        let addr = self.addr(apps::HTTP_PORT).to_string();
        (0..n)
            .map(|_| http_in(&self.clients[i].netns.path(), &addr, "GET", "/hello", "").map_or(0, |(s, _)| s))
            .collect()
    }

    fn accept_errors(&self, error: &str) -> f64 {
        self.proxy.metric(&format!("inbound_tcp_accept_errors_total{{error=\"{error}\"}}"))
    }
}

fn with_setup(test: &str, sources: usize, env: &[(&str, &str)], open_files: Option<u64>, f: impl FnOnce(&Setup<'_>)) {
    if !require_root(test) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let server = Pod::named(&net, "shop", "server").unwrap();
    let apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let proxy = match open_files {
        Some(n) => Sidecar::start_with_open_files(&bins.proxy, &server.netns, env, n).unwrap(),
        None => Sidecar::start(&bins.proxy, &server.netns, env).unwrap(),
    };
    let clients = (0..sources).map(|i| Pod::unmeshed(&net, "shop", &format!("client-{i}")).unwrap()).collect();
    f(&Setup { server, apps, proxy, clients });
}

/// `n` connection attempts from inside `netns` that send nothing; the connections made (a shed
/// one may be reset before connect() even returns).
fn idle_connections(netns: &Path, to: SocketAddr, n: usize) -> Vec<TcpStream> {
    cnimesh_cni::netns::run_in(netns, move || {
        (0..n).filter_map(|_| TcpStream::connect_timeout(&to, Duration::from_secs(5)).ok()).collect()
    })
    .unwrap()
}

/// Whether the proxy still holds `s` open: a read that neither ends nor fails within `wait`.
fn still_open(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    matches!(s.read(&mut [0u8; 64]), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

#[test]
fn an_idle_flood_larger_than_the_fd_limit_does_not_turn_normal_requests_into_errors() {
    const OPEN_FILES: u64 = 256;
    // Detection is cut short so the flood outlives it within the test.
    let env = [("CNIMESH_PROXY_DETECT_TIMEOUT_MS", "1000")];
    with_setup(
        "an_idle_flood_larger_than_the_fd_limit_does_not_turn_normal_requests_into_errors",
        2,
        &env,
        Some(OPEN_FILES),
        |s| {
            assert_eq!(s.requests(1, 1), [200]);
            let fds_before = s.proxy.open_fds();
            let accepted_before = s.apps.accepted.load(Ordering::SeqCst);
            let flood = idle_connections(&s.clients[0].netns.path(), s.addr(apps::HTTP_PORT), 2 * OPEN_FILES as usize);
            // While the flood is open, in detection and after it.
            let during = s.requests(1, 10);
            std::thread::sleep(Duration::from_millis(1500));
            let after_detection = s.requests(1, 10);
            assert_eq!(during, [200; 10], "requests while {} idle connections are open", flood.len());
            assert_eq!(after_detection, [200; 10], "requests once the flood outlived detection");
            assert!(s.accept_errors("source_limit") > 0.0, "{}", s.proxy.metrics());
            assert!(s.accept_errors("detect_timeout") > 0.0, "{}", s.proxy.metrics());
            let reached_app = s.apps.accepted.load(Ordering::SeqCst) - accepted_before;
            assert!(reached_app <= 20, "the idle connections never reach the app: {reached_app} app connections");
            drop(flood);
            eventually("the proxy's descriptors are back to where they were", Duration::from_secs(20), || {
                s.proxy.open_fds() <= fds_before + 4
            });
        },
    );
}

#[test]
fn a_per_source_limit_keeps_a_second_source_served() {
    let env = [
        ("CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS", "40"),
        ("CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS_PER_SOURCE", "10"),
        // The flood stays in detection for the whole test.
        ("CNIMESH_PROXY_DETECT_TIMEOUT_MS", "60000"),
    ];
    with_setup("a_per_source_limit_keeps_a_second_source_served", 2, &env, None, |s| {
        let mut flood = idle_connections(&s.clients[0].netns.path(), s.addr(apps::HTTP_PORT), 30);
        let open = flood.iter_mut().map(|c| still_open(c, Duration::from_millis(300))).filter(|open| *open).count();
        assert_eq!(open, 10, "the first source keeps exactly its share");
        assert_eq!(s.accept_errors("source_limit"), 20.0, "{}", s.proxy.metrics());
        assert_eq!(s.requests(1, 10), [200; 10], "the second source is served");
        // The first source's share frees as its connections close.
        drop(flood);
        eventually("the first source is served again", Duration::from_secs(20), || s.requests(0, 1) == [200]);
        assert_eq!(s.accept_errors("connection_limit"), 0.0);
    });
}

#[test]
fn silent_and_dribbling_clients_are_closed_and_never_reach_the_app() {
    let env = [("CNIMESH_PROXY_DETECT_TIMEOUT_MS", "500")];
    with_setup("silent_and_dribbling_clients_are_closed_and_never_reach_the_app", 1, &env, None, |s| {
        let to = s.addr(apps::HTTP_PORT);
        let accepted_before = s.apps.accepted.load(Ordering::SeqCst);
        // One byte every 100 ms from the first byte: a valid request line, never finished in time.
        let dribbled = cnimesh_cni::netns::run_in(&s.clients[0].netns.path(), move || {
            let mut c = TcpStream::connect(to)?;
            let mut sent = 0;
            for b in b"GET /hello HTTP/1.1\r\nHost: server\r\n\r\n" {
                std::thread::sleep(Duration::from_millis(100));
                if c.write_all(&[*b]).is_err() {
                    break;
                }
                sent += 1;
            }
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut answer = Vec::new();
            let _ = c.read_to_end(&mut answer);
            std::io::Result::Ok((sent, String::from_utf8_lossy(&answer).into_owned()))
        })
        .unwrap()
        .unwrap();
        assert!(!dribbled.1.contains("hello from"), "the dribbler got an answer: {dribbled:?}");
        let mut silent =
            cnimesh_cni::netns::run_in(&s.clients[0].netns.path(), move || TcpStream::connect(to)).unwrap().unwrap();
        silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let ended = silent.read(&mut [0u8; 64]);
        assert!(matches!(ended, Ok(0)) || ended.is_err_and(|e| e.kind() == ErrorKind::ConnectionReset));
        assert_eq!(s.apps.accepted.load(Ordering::SeqCst), accepted_before, "the app saw no connection");
        assert_eq!(s.accept_errors("detect_timeout"), 2.0, "{}", s.proxy.metrics());
        assert_eq!(s.requests(0, 1), [200], "a client that speaks is served");
    });
}

#[test]
fn opaque_ports_still_forward_silent_clients() {
    let env = [("CNIMESH_PROXY_DETECT_TIMEOUT_MS", "300"), ("CNIMESH_PROXY_OPAQUE_PORTS", "5432,9000")];
    with_setup("opaque_ports_still_forward_silent_clients", 1, &env, None, |s| {
        let (banner, half_close) = (s.addr(apps::BANNER_PORT), s.addr(apps::HALF_CLOSE_PORT));
        let (greeting, answer) = cnimesh_cni::netns::run_in(&s.clients[0].netns.path(), move || {
            // Server speaks first: the client waits for the greeting, well past the detect timeout.
            let mut c = TcpStream::connect(banner)?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut greeting = vec![0u8; apps::BANNER.len()];
            c.read_exact(&mut greeting)?;
            // A client that speaks late on an opaque port.
            let mut c = TcpStream::connect(half_close)?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            std::thread::sleep(Duration::from_millis(800));
            c.write_all(b"12345")?;
            c.shutdown(std::net::Shutdown::Write)?;
            let mut answer = String::new();
            c.read_to_string(&mut answer)?;
            std::io::Result::Ok((String::from_utf8_lossy(&greeting).into_owned(), answer))
        })
        .unwrap()
        .unwrap();
        assert_eq!(greeting, apps::BANNER);
        assert_eq!(answer, "got 5");
        assert_eq!(s.accept_errors("detect_timeout"), 0.0);
    });
}
