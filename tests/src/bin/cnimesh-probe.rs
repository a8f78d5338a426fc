//! Traffic probe for the end-to-end tests and the demo.
//!
//! `cnimesh-probe listen NAME NETNS ADDR...` binds every address inside NETNS, prints `ready`, and
//! answers each connection with a JSON [`Report`] line (which listener took it, and its
//! SO_ORIGINAL_DST); it exits when its stdin closes, so it never outlives its test.
//!
//! `cnimesh-probe serve NAME ADDR...` does the same in its own netns and lives until killed: a
//! stand-in proxy that a supervisor (host mode's agent) starts, restarts and stops.
//!
//! `cnimesh-probe connect NETNS ADDR [UID]` connects from inside NETNS, as UID if given (the proxy
//! UID bypass), and prints the report it got back.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{Context, bail};
use cnimesh_e2e::Report;
use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, sockopt};

const TIMEOUT: Duration = Duration::from_secs(5);

fn enter(netns: &str) -> anyhow::Result<()> {
    let file = std::fs::File::open(netns).with_context(|| format!("open {netns}"))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
    Ok(())
}

/// A listening socket; IPv6 ones are v6-only so `0.0.0.0:P` and `[::]:P` can coexist.
fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let family = if addr.is_ipv6() { AddressFamily::Inet6 } else { AddressFamily::Inet };
    let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        socket::setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(addr))
        .with_context(|| format!("bind {addr}"))?;
    socket::listen(&fd, Backlog::new(128)?)?;
    Ok(TcpListener::from(fd))
}

fn original_dst(stream: &TcpStream) -> Option<String> {
    let fd = stream.as_fd();
    if stream.local_addr().ok()?.is_ipv6() {
        let sa = socket::getsockopt(&fd, sockopt::Ip6tOriginalDst).ok()?;
        let ip = std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr);
        Some(SocketAddr::from((ip, u16::from_be(sa.sin6_port))).to_string())
    } else {
        let sa = socket::getsockopt(&fd, sockopt::OriginalDst).ok()?;
        let ip = std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
        Some(SocketAddr::from((ip, u16::from_be(sa.sin_port))).to_string())
    }
}

fn serve(name: String, bound: SocketAddr, listener: TcpListener) {
    for mut stream in listener.incoming().flatten() {
        let report = Report {
            name: name.clone(),
            listener: bound.to_string(),
            local: stream.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            peer: stream.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
            orig_dst: original_dst(&stream),
        };
        let line = serde_json::to_string(&report).expect("serialisable") + "\n";
        let _ = stream.write_all(line.as_bytes());
    }
}

fn bind_all(name: &str, addrs: &[String]) -> anyhow::Result<()> {
    // Like the proxy: listeners handed down (`cnimesh-node host`, LISTEN_FDS) are adopted by
    // address; the others are bound.
    let mut inherited = listenfd::ListenFd::from_env();
    let mut handed: Vec<TcpListener> = Vec::new();
    for index in 0..inherited.len() {
        if let Some(l) = inherited.take_tcp_listener(index)? {
            l.set_nonblocking(false)?;
            handed.push(l);
        }
    }
    for addr in addrs {
        let addr: SocketAddr = addr.parse().with_context(|| format!("address {addr}"))?;
        let listener = match handed.iter().position(|l| l.local_addr().is_ok_and(|a| a == addr)) {
            Some(i) => handed.remove(i),
            None => bind(addr)?,
        };
        let name = name.to_string();
        std::thread::spawn(move || serve(name, addr, listener));
    }
    Ok(())
}

fn listen(name: &str, netns: &str, addrs: &[String]) -> anyhow::Result<()> {
    enter(netns)?;
    bind_all(name, addrs)?;
    println!("ready");
    std::io::stdout().flush()?;
    // Lives until the parent closes stdin (or dies).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}

fn serve_until_killed(name: &str, addrs: &[String]) -> anyhow::Result<()> {
    bind_all(name, addrs)?;
    println!("ready");
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}

fn connect(netns: &str, to: &str, uid: Option<&String>) -> anyhow::Result<()> {
    enter(netns)?;
    if let Some(uid) = uid {
        nix::unistd::setuid(nix::unistd::Uid::from_raw(uid.parse()?)).context("setuid")?;
    }
    let to: SocketAddr = to.parse()?;
    let stream = TcpStream::connect_timeout(&to, TIMEOUT).with_context(|| format!("connect {to}"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.is_empty() {
        bail!("connection to {to} closed without a report");
    }
    print!("{line}");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, name, netns, addrs @ ..] if cmd == "listen" && !addrs.is_empty() => listen(name, netns, addrs),
        [cmd, name, addrs @ ..] if cmd == "serve" && !addrs.is_empty() => serve_until_killed(name, addrs),
        [cmd, netns, to, rest @ ..] if cmd == "connect" && rest.len() <= 1 => connect(netns, to, rest.first()),
        _ => bail!("usage: cnimesh-probe listen NAME NETNS ADDR... | serve NAME ADDR... | connect NETNS ADDR [UID]"),
    }
}
