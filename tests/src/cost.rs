//! Per-request cost of a running process, measured in ways the load of the machine does not
//! move: instructions (callgrind), syscalls by kind and TLS records written (strace), context
//! switches (/proc), allocations (calls into the allocator, from callgrind's call graph), and a
//! profile summary by bucket (I/O, TLS, HTTP codec, …) from callgrind's per-function costs.
//! CPU time is measured too, but on a shared machine only instruction counts compare well.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Voluntary and involuntary context switches of every thread of `pid` so far.
pub fn ctxt_switches(pid: u32) -> (u64, u64) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>());
    let mut sum = (0, 0);
    for task in tasks.unwrap_or_default() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
        };
        sum.0 += field("voluntary_ctxt_switches:");
        sum.1 += field("nonvoluntary_ctxt_switches:");
    }
    sum
}

/// Write-type syscalls (`syscw` of /proc/<pid>/io: write, writev; not sendto/sendmsg) of
/// `pid` so far: counted by the kernel, so unlike strace they do not slow the process and
/// change how its requests batch.
pub fn write_syscalls(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("syscw:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// strace attached to one running process (all its threads) until [`Strace::finish`].
pub struct Strace {
    child: Child,
    out: PathBuf,
}

impl Strace {
    /// Counts `pid`'s syscalls by kind (`strace -c`), into `out`.
    pub fn count(pid: u32, out: &Path) -> Self {
        Self::attach(pid, out, &["-c"])
    }

    /// Logs `pid`'s writes with their bytes (hex), into `out`: what [`tls_records`] reads.
    pub fn writes(pid: u32, out: &Path) -> Self {
        Self::attach(pid, out, &["-e", "trace=write,writev,sendto,sendmsg", "-xx", "-s", "65536"])
    }

    fn attach(pid: u32, out: &Path, args: &[&str]) -> Self {
        let child = Command::new("strace")
            .args(["-f", "-qq", "-o"])
            .arg(out)
            .args(args)
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("strace runs (apt-get install strace)");
        // strace attaches every thread before the measured load starts.
        std::thread::sleep(Duration::from_millis(500));
        Self { child, out: out.to_owned() }
    }

    /// Detaches (SIGINT: strace writes its summary) and returns what it wrote.
    pub fn finish(mut self) -> String {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = self.child.wait();
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

/// Calls by syscall from `strace -c`'s summary table.
pub fn syscall_counts(summary: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let mut rules = 0;
    for line in summary.lines() {
        if line.starts_with("------") {
            rules += 1;
            continue;
        }
        if rules != 1 {
            continue;
        }
        // % time, seconds, usecs/call, calls, [errors], syscall
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let (Some(name), Some(calls)) = (fields.last(), fields.get(3).and_then(|c| c.parse().ok())) {
            counts.insert((*name).to_owned(), calls);
        }
    }
    counts
}

/// TLS records written, from a [`Strace::writes`] log: (application-data records, all
/// records). A write is read as TLS when it starts with a record header; plain HTTP writes
/// (to the app, to the client) are not counted.
pub fn tls_records(log: &str) -> (u64, u64) {
    let mut counts = (0, 0);
    for line in log.lines() {
        let call = line.split_once(' ').map_or(line, |(_, rest)| rest.trim_start());
        if !["write(", "writev(", "sendto(", "sendmsg("].iter().any(|c| call.starts_with(c)) {
            continue;
        }
        let bytes = quoted_bytes(call);
        let mut at = 0;
        while at + 5 <= bytes.len() {
            let (kind, major) = (bytes[at], bytes[at + 1]);
            if !(20..=23).contains(&kind) || major != 3 {
                break;
            }
            counts.1 += 1;
            if kind == 23 {
                counts.0 += 1;
            }
            at += 5 + usize::from(u16::from_be_bytes([bytes[at + 3], bytes[at + 4]]));
        }
    }
    counts
}

/// The bytes of every `"\x..\x.."` string of an strace line, in order (a writev's buffers
/// joined).
fn quoted_bytes(call: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (i, part) in call.split('"').enumerate() {
        if i % 2 == 1 {
            bytes.extend(part.split("\\x").filter(|h| h.len() == 2).filter_map(|h| u8::from_str_radix(h, 16).ok()));
        }
    }
    bytes
}

/// The valgrind command that runs a proxy under callgrind, its profile written to `dir`
/// (which the proxy's user must be able to write).
///
/// glibc copies and fills large blocks with `rep movsb`/`rep stosb`, which callgrind counts as
/// one instruction per byte, against a few per 32 bytes in the vector loop it uses below its
/// threshold: a future that grows past the threshold would look many times dearer than it is.
/// The thresholds are raised so that every copy is counted alike.
pub fn callgrind_wrapper(dir: &Path) -> Vec<String> {
    vec![
        "env".into(),
        "GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1073741824:glibc.cpu.x86_rep_stosb_threshold=1073741824"
            .into(),
        "valgrind".into(),
        "--tool=callgrind".into(),
        "--quiet".into(),
        format!("--callgrind-out-file={}/callgrind.%p", dir.display()),
    ]
}

/// Zeroes the counters of the callgrind-run process `pid` (the start of a measured window).
pub fn callgrind_zero(pid: u32) {
    callgrind_control(pid, "-z");
}

/// Dumps the counters of `pid` since the last zero and returns the dump's path.
pub fn callgrind_dump(pid: u32, dir: &Path) -> PathBuf {
    callgrind_control(pid, "-d");
    let prefix = format!("callgrind.{pid}.");
    let newest = std::fs::read_dir(dir)
        .expect("callgrind's directory")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
    newest.expect("callgrind wrote a dump").path()
}

/// Runs `callgrind_control` as the proxy's user: valgrind's gdbserver answers only its own
/// user's vgdb.
fn callgrind_control(pid: u32, op: &str) {
    let (uid, gid) =
        (format!("--reuid={}", crate::sidecar::PROXY_UID), format!("--regid={}", crate::sidecar::PROXY_UID));
    let out = Command::new("setpriv")
        .args([&uid, &gid, "--clear-groups", "callgrind_control", op, &pid.to_string()])
        .output()
        .expect("callgrind_control");
    assert!(out.status.success(), "callgrind_control {op} {pid}: {}", String::from_utf8_lossy(&out.stderr));
}

/// One callgrind dump read: total instructions, calls into the allocator, and per function its
/// own and inclusive instructions.
#[derive(Debug, Default, Clone)]
pub struct Profile {
    pub instructions: u64,
    pub allocations: u64,
    /// Function name (demangled) → instructions executed in the function itself.
    pub own: BTreeMap<String, u64>,
    /// Function name → instructions in it and everything it called.
    pub inclusive: BTreeMap<String, u64>,
}

impl Profile {
    /// Reads a dump: inclusive costs with `callgrind_annotate` (which handles recursion), own
    /// costs and allocator calls from the raw file. (`callgrind_annotate --inclusive=no` charges
    /// the frames still on the stack at a mid-run dump with everything below them.)
    pub fn read(dump: &Path) -> Self {
        let out = Command::new("callgrind_annotate")
            .args(["--inclusive=yes", "--threshold=100"])
            .arg(dump)
            .output()
            .expect("callgrind_annotate runs");
        let raw = std::fs::read_to_string(dump).expect("callgrind dump");
        Self {
            instructions: total_instructions(&raw),
            allocations: allocator_calls(&raw),
            own: own_costs(&raw),
            inclusive: function_costs(&String::from_utf8_lossy(&out.stdout)),
        }
    }

    /// Own instructions grouped by [`bucket`].
    pub fn buckets(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for (name, cost) in &self.own {
            *out.entry(bucket(name)).or_default() += cost;
        }
        out
    }

    /// This profile and `other` added (a pair of proxies as one).
    pub fn add(&mut self, other: &Profile) {
        self.instructions += other.instructions;
        self.allocations += other.allocations;
        for (map, from) in [(&mut self.own, &other.own), (&mut self.inclusive, &other.inclusive)] {
            for (name, cost) in from {
                *map.entry(name.clone()).or_default() += cost;
            }
        }
    }
}

/// The `summary:`/`totals:` instruction count of a raw callgrind file.
fn total_instructions(raw: &str) -> u64 {
    raw.lines()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The allocator's entry points (jemalloc's, prefixed `_rjem_`, or libc's).
const ALLOCATOR: &[&str] =
    &["_rjem_malloc", "_rjem_mallocx", "_rjem_calloc", "_rjem_realloc", "_rjem_rallocx", "malloc", "calloc", "realloc"];

/// Calls into the allocator's entry points in a raw callgrind file (its `cfn=` and `calls=`
/// lines; names are compressed as `(id) name` once, `(id)` after).
fn allocator_calls(raw: &str) -> u64 {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut callee = "";
    let mut calls = 0;
    for line in raw.lines() {
        if let Some(rest) = line.strip_prefix("cfn=").or_else(|| line.strip_prefix("fn=")) {
            let name = match rest.split_once(' ') {
                Some((id, name)) => {
                    names.insert(id, name);
                    name
                }
                None => names.get(rest).copied().unwrap_or(rest),
            };
            if line.starts_with("cfn=") {
                callee = name;
            }
        } else if let Some(rest) = line.strip_prefix("calls=")
            && ALLOCATOR.contains(&callee)
        {
            calls += rest.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    calls
}

/// Instructions executed in each function itself, from a raw callgrind file: the cost lines
/// under each `fn=`, except those right after a `calls=` line (the cost of that call).
fn own_costs(raw: &str) -> BTreeMap<String, u64> {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    let (mut current, mut after_call) = ("", false);
    for line in raw.lines() {
        if let Some(rest) = line.strip_prefix("fn=") {
            current = match rest.split_once(' ') {
                Some((id, name)) => {
                    names.insert(id, name);
                    name
                }
                None => names.get(rest).copied().unwrap_or(rest),
            };
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            if let Some((id, name)) = rest.split_once(' ') {
                names.insert(id, name);
            }
        } else if line.starts_with("calls=") {
            after_call = true;
            continue;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-' || c == '*') {
            let cost = line.split_whitespace().nth(1).and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
            if !after_call && !current.is_empty() {
                *out.entry(current.to_owned()).or_default() += cost;
            }
        }
        after_call = false;
    }
    out
}

/// Function costs from `callgrind_annotate` output: lines `1,234 (1.2%)  file:function [object]`.
fn function_costs(annotated: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in annotated.lines() {
        let line = line.trim_start();
        let Some((count, rest)) = line.split_once(' ') else { continue };
        let Ok(cost) = count.replace(',', "").parse::<u64>() else { continue };
        let rest = rest.trim_start();
        let rest = if rest.starts_with('(') { rest.split_once(')').map_or(rest, |(_, r)| r) } else { rest };
        let rest = rest.trim();
        if rest.is_empty() || rest.starts_with("PROGRAM TOTALS") || rest.starts_with("events annotated") {
            continue;
        }
        let name = rest.rsplit_once(" [").map_or(rest, |(name, _)| name);
        let name = name.split_once(':').filter(|(file, _)| !file.contains('<')).map_or(name, |(_, f)| f);
        *out.entry(name.to_owned()).or_default() += cost;
    }
    out
}

/// The buckets of the profile summary, in print order.
pub const BUCKETS: &[&str] = &[
    "I/O",
    "TLS",
    "HTTP codec",
    "routing/policy",
    "metrics",
    "tracing",
    "tap",
    "runtime",
    "alloc",
    "memcpy/memset",
    "proxy (other)",
    "other",
];

/// Which part of the proxy a function is, by its symbol: the first crate (or the proxy's
/// module) named in it, so `<cnimesh_proxy::… as tower::Service>::call` is the proxy's and a
/// generic tokio task polling it is the runtime's.
pub fn bucket(name: &str) -> &'static str {
    let n = name.trim_start_matches(['<', '&']);
    if n.starts_with("_rjem_") || n.starts_with("je_") || n.contains("jemalloc") || n.starts_with("__rust_") {
        return "alloc";
    }
    if ["memcpy", "memmove", "memset", "__memcpy", "__memmove", "__memset", "__memcmp", "memcmp", "bcmp"]
        .iter()
        .any(|p| n.starts_with(p))
    {
        return "memcpy/memset";
    }
    if ["ring_core_", "aws_lc", "aes_", "gcm_", "ChaCha20", "chacha20_", "sha256_", "sha512_", "x25519", "bn_", "ecp_"]
        .iter()
        .any(|p| n.starts_with(p))
    {
        return "TLS";
    }
    let first_crate = n
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|seg| seg.contains("::"))
        .map(|seg| seg.trim_start_matches(':'))
        .find(|seg| !["core::", "alloc::", "std::"].iter().any(|p| seg.starts_with(p)));
    let Some(path) = first_crate else {
        return if n.contains("std::sys") || n.contains("std::io") || n.starts_with("__libc") || is_syscall(n) {
            "I/O"
        } else if n.starts_with("alloc::") || n.contains("alloc::alloc") || n.contains("raw_vec") {
            "alloc"
        } else {
            "other"
        };
    };
    let crate_name = path.split("::").next().unwrap_or("");
    match crate_name {
        "rustls" | "ring" | "aws_lc_rs" | "tokio_rustls" | "rustls_pki_types" | "webpki" | "rustls_webpki" => "TLS",
        "hyper" | "h2" | "http" | "httparse" | "hyper_util" | "http_body" | "http_body_util" | "httpdate" => {
            "HTTP codec"
        }
        "mio" => "I/O",
        "tokio" if path.starts_with("tokio::net") || path.starts_with("tokio::io") || path.contains("::io::") => "I/O",
        "tokio" | "futures_util" | "futures_core" | "futures_channel" | "parking_lot" | "parking_lot_core"
        | "tower" | "tower_service" | "tower_layer" | "pin_project" | "pin_project_lite" => "runtime",
        "prometheus_client" => "metrics",
        "tracing" | "tracing_core" | "tracing_subscriber" | "cnimesh_trace" => "tracing",
        "cnimesh_policy_rules" | "regex" | "regex_automata" | "ipnet" => "routing/policy",
        "cnimesh_proxy" => proxy_bucket(path),
        "tikv_jemallocator" | "hashbrown" => "alloc",
        _ => "other",
    }
}

/// The bucket of one of the proxy's own functions, by module.
fn proxy_bucket(path: &str) -> &'static str {
    if path.contains("metrics") {
        "metrics"
    } else if path.contains("tap") {
        "tap"
    } else if path.contains("trace") || path.contains("span") {
        "tracing"
    } else if ["::inbound", "::outbound", "::client", "::gateway", "::decision", "::routed"]
        .iter()
        .any(|m| path.contains(m))
    {
        "routing/policy"
    } else if path.contains("::transport::tls") {
        "TLS"
    } else if path.contains("::transport") {
        "I/O"
    } else {
        "proxy (other)"
    }
}

/// Whether `name` is a libc syscall wrapper.
fn is_syscall(name: &str) -> bool {
    [
        "read",
        "write",
        "writev",
        "readv",
        "recv",
        "recvfrom",
        "recvmsg",
        "send",
        "sendto",
        "sendmsg",
        "epoll_wait",
        "epoll_ctl",
        "syscall",
        "__GI___",
        "clock_gettime",
        "__clock_gettime",
        "futex",
        "accept4",
    ]
    .iter()
    .any(|p| name == *p || name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summary_gives_calls_by_syscall() {
        let summary = "% time     seconds  usecs/call     calls    errors syscall\n\
            ------ ----------- ----------- --------- --------- ----------------\n\
            \x2040.00    0.000400          20        20           writev\n\
            \x2030.00    0.000300          10        30        10 recvfrom\n\
            ------ ----------- ----------- --------- --------- ----------------\n\
            100.00    0.000700          14        50        10 total\n";
        let counts = syscall_counts(summary);
        assert_eq!(counts.get("writev"), Some(&20));
        assert_eq!(counts.get("recvfrom"), Some(&30));
        assert_eq!(counts.get("total"), None);
    }

    #[test]
    fn tls_records_are_counted_in_writes_that_start_with_a_record_header() {
        let log = "12 writev(9, [{iov_base=\"\\x17\\x03\\x03\\x00\\x02\\xaa\\xbb\", iov_len=7}, {iov_base=\"\\x17\\x03\\x03\\x00\\x01\\xcc\", iov_len=6}], 2) = 13\n\
            12 write(10, \"\\x48\\x54\\x54\\x50\", 4) = 4\n\
            13 sendto(9, \"\\x15\\x03\\x03\\x00\\x02\\x01\\x00\", 7, MSG_NOSIGNAL, NULL, 0) = 7\n";
        assert_eq!(tls_records(log), (2, 3), "two application-data records and one alert; HTTP not counted");
    }

    #[test]
    fn allocator_calls_follow_compressed_callee_names() {
        let raw = "fn=(1) main\ncfn=(2) _rjem_malloc\ncalls=3 0\n0 30\ncfn=(3) other\ncalls=5 0\n0 5\nfn=(4) f\ncfn=(2)\ncalls=2 0\n0 20\ntotals: 1234\n";
        assert_eq!(allocator_calls(raw), 5);
        let own = own_costs("fn=(1) main\n0 7\ncfn=(2) g\ncalls=1 0\n0 30\n+1 3\nfn=(2)\n0 30\n");
        assert_eq!(own.get("main"), Some(&10), "a call's cost is not the caller's own");
        assert_eq!(own.get("g"), Some(&30));
        assert_eq!(total_instructions(raw), 1234);
    }

    #[test]
    fn annotated_functions_are_named_without_file_and_object() {
        let text = "--------\n1,000 (100.0%)  PROGRAM TOTALS\n--------\n\
            \x20 600 (60.00%)  ???:hyper::proto::h1::role::Server::parse [/bin/proxy]\n\
            \x20 400 (40.00%)  ???:_rjem_malloc [/bin/proxy]\n";
        let costs = function_costs(text);
        assert_eq!(costs.get("hyper::proto::h1::role::Server::parse"), Some(&600));
        assert_eq!(costs.get("_rjem_malloc"), Some(&400));
        assert_eq!(costs.len(), 2);
    }

    #[test]
    fn functions_fall_in_the_bucket_of_the_first_crate_they_name() {
        assert_eq!(bucket("<hyper::proto::h1::conn::Conn<I,B,T>>::poll_read"), "HTTP codec");
        assert_eq!(bucket("<cnimesh_proxy::app::metrics::Measured<S> as tower_service::Service<R>>::call"), "metrics");
        assert_eq!(bucket("tokio::runtime::scheduler::current_thread::Context::park"), "runtime");
        assert_eq!(bucket("core::ptr::drop_in_place<rustls::conn::ConnectionCommon<T>>"), "TLS");
        assert_eq!(bucket("_rjem_malloc"), "alloc");
        assert_eq!(bucket("aes_hw_ctr32_encrypt_blocks"), "TLS");
        assert_eq!(bucket("__memcpy_avx_unaligned_erms"), "memcpy/memset");
        assert_eq!(bucket("mio::poll::Poll::poll"), "I/O");
    }
}
