//! Tap lines as `linkerd viz tap` prints them (`-o text`), with identities and pods (`-o wide`),
//! or as the relay's JSON (`-o json`).
//!
//! Layer: model (pure).

use std::fmt::Write as _;

use cnimesh_model::tap::{Body, Stream, TapLine};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TapOutput {
    Text,
    Wide,
    Json,
}

/// One event as one line, newline included.
pub fn line(line: &TapLine, output: TapOutput) -> String {
    if output == TapOutput::Json {
        return serde_json::to_string(line).expect("serialisable") + "\n";
    }
    let mut text = match &line.body {
        Body::Error { message } => return format!("error pod={}/{} {message}\n", line.namespace, line.pod),
        Body::RequestInit { at, method, authority, path, .. } => {
            format!("req {} :method={method} :authority={authority} :path={path}", common(at))
        }
        Body::ResponseInit { at, since_request_init_us, http_status } => {
            format!("rsp {} :status={http_status} latency={}", common(at), duration(*since_request_init_us))
        }
        Body::ResponseEnd { at, since_response_init_us, response_bytes, grpc_status, reset_code, .. } => {
            let mut text = format!(
                "end {} duration={} response-length={response_bytes}B",
                common(at),
                duration(*since_response_init_us)
            );
            if let Some(code) = grpc_status {
                let code = tonic::Code::from(i32::try_from(*code).unwrap_or(i32::MAX));
                let _ = write!(text, " grpc-status={code:?}");
            }
            if let Some(code) = reset_code {
                let _ = write!(text, " reset-error={code}");
            }
            text
        }
    };
    if output == TapOutput::Wide
        && let Some(at) = line.body.stream()
    {
        let _ = write!(
            text,
            " client-id={} server-id={} pod={}/{}",
            label(at, "client_id"),
            label(at, "server_id"),
            line.namespace,
            line.pod
        );
        if let Some(route) = at.route_meta.get("name").or_else(|| at.route_meta.get("route")) {
            let _ = write!(text, " route={route}");
        }
        if let Some((network, _)) = egress(at) {
            let address = at.destination.map_or_else(|| "-".to_string(), |a| a.to_string());
            let _ = write!(text, " egress-network={network} dst-addr={address}");
        }
    }
    text.push('\n');
    text
}

/// `id=… proxy=in  src=… dst=… tls=…`: what every event line starts with.
fn common(at: &Stream) -> String {
    let proxy = match at.direction.as_str() {
        "inbound" => "in ",
        "outbound" => "out",
        _ => "?  ",
    };
    let addr = |a: Option<std::net::SocketAddr>| a.map_or_else(|| "-".to_string(), |a| a.to_string());
    let dst =
        egress(at).map_or_else(|| addr(at.destination), |(_, hostname)| crate::stat::compute::egress_dst(hostname));
    format!("id={} proxy={proxy} src={} dst={dst} tls={}", at.id, addr(at.source), tls(at))
}

/// A request to an EgressNetwork's destination, as its proxy labelled it: the
/// EgressNetwork (`<ns>/<name>`) and the hostname.
pub fn egress(at: &Stream) -> Option<(&str, &str)> {
    let meta = &at.destination_meta;
    if meta.get("dst_kind").map(String::as_str) != Some("egress") {
        return None;
    }
    Some((meta.get("egress_network").map_or("-", String::as_str), meta.get("dst_hostname")?.as_str()))
}

/// The TLS status of the connection the request came on: the peer's side as the proxy saw it
/// (the source for inbound, the destination for outbound).
pub fn tls(at: &Stream) -> &str {
    let (near, far) =
        if at.inbound() { (&at.source_meta, &at.destination_meta) } else { (&at.destination_meta, &at.source_meta) };
    near.get("tls").or_else(|| far.get("tls")).map_or("-", String::as_str)
}

/// A label from either side's metadata, `-` when neither has it.
pub fn label<'a>(at: &'a Stream, key: &str) -> &'a str {
    at.source_meta.get(key).or_else(|| at.destination_meta.get(key)).map_or("-", String::as_str)
}

/// Microseconds as Go prints durations (`812µs`, `1.234ms`, `2.5s`), as Linkerd's tap does.
pub fn duration(us: u64) -> String {
    let trim = |value: f64| {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    match us {
        0..1_000 => format!("{us}µs"),
        1_000..1_000_000 => format!("{}ms", trim(us as f64 / 1e3)),
        _ => format!("{}s", trim(us as f64 / 1e6)),
    }
}
