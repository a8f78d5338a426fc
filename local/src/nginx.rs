//! Debian's nginx (`/usr/sbin/nginx`, `apt-get install nginx-light`) as an ingress controller:
//! the one place its configuration is rendered, for local mode's `ingress:` and for the
//! end-to-end tests that put it in front of the mesh.
//!
//! nginx runs in the foreground without a master process (so the process started is the one that
//! serves, and stopping it stops nginx), with every path under a directory of its own (no write
//! to /var/lib/nginx or /run).

use std::net::SocketAddr;
use std::path::Path;

/// The nginx binary Debian installs.
pub const NGINX: &str = "/usr/sbin/nginx";

/// The whole `nginx.conf`: its pid and temporary files under `dir`, errors to stderr, no access
/// log, and `servers` (complete `server { }` blocks) in its `http` block.
pub fn config(dir: &Path, servers: &str) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log stderr warn;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n{servers}}}\n"
    )
}

/// One `server { }` block on `listen`, answering for `server_name` (any name when `None`),
/// with `locations` as its body.
pub fn server(listen: SocketAddr, server_name: Option<&str>, locations: &str) -> String {
    let name = server_name.map(|n| format!("    server_name {n};\n")).unwrap_or_default();
    format!("  server {{\n    listen {listen};\n{name}{locations}  }}\n")
}

/// A `location /{prefix}` proxying to `upstream` (`ip:port`) over HTTP/1.1 with `header` (`Name
/// value`) set: the header an ingress names the Service with, `Host` or Linkerd's
/// `l5d-dst-override`, which the ingress's proxy routes by. An empty `prefix` is `location /`.
pub fn location(prefix: &str, upstream: &str, header: &str) -> String {
    let path = if prefix.is_empty() { "/".to_string() } else { format!("/{prefix}/") };
    format!(
        "    location {path} {{\n      proxy_pass http://{upstream}/;\n      proxy_http_version 1.1;\n      proxy_set_header {header};\n    }}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_renders_as_a_server_proxying_to_the_service_by_its_name() {
        let listen: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let routes =
            server(listen, Some("web.demo"), &location("", "10.96.0.10:80", "Host web.demo.svc.cluster.local"));
        let conf = config(Path::new("/run/x/ingress"), &routes);
        assert!(conf.contains("daemon off;\nmaster_process off;"), "{conf}");
        assert!(conf.contains("pid /run/x/ingress/nginx.pid;"), "{conf}");
        assert!(conf.contains("    listen 0.0.0.0:8080;\n    server_name web.demo;\n    location / {"), "{conf}");
        assert!(conf.contains("proxy_pass http://10.96.0.10:80/;"), "{conf}");
        assert!(conf.contains("proxy_set_header Host web.demo.svc.cluster.local;"), "{conf}");
        assert_eq!(conf.matches('{').count(), conf.matches('}').count(), "{conf}");
    }
}
