//! nf_tables change notifications: the kernel multicasts every committed ruleset change of a
//! network namespace (any table, any tool: `nft`, iptables-nft, our own transactions) to the
//! `NFNLGRP_NFTABLES` group. Listening there lets a long-running watcher re-check its rules the
//! moment someone flushes or edits them, and sleep otherwise: no polling.

use std::io;

use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

use super::NftError;

/// `NFNLGRP_NFTABLES` (linux/netfilter/nfnetlink.h).
const NFNLGRP_NFTABLES: u32 = 7;

/// A subscription to the ruleset changes of the network namespace of the thread that opened it.
pub struct NftEvents {
    socket: Socket,
}

impl NftEvents {
    pub fn subscribe() -> Result<Self, NftError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NftError::Socket)?;
        socket.bind_auto().map_err(NftError::Socket)?;
        socket.add_membership(NFNLGRP_NFTABLES).map_err(NftError::Socket)?;
        Ok(Self { socket })
    }

    /// Blocks until the ruleset changed. A lost notification (the socket's queue overflowed,
    /// `ENOBUFS`) counts as a change: the caller looks again rather than miss one.
    pub fn wait(&mut self) -> Result<(), NftError> {
        let mut buf = vec![0u8; 64 * 1024];
        match self.socket.recv(&mut &mut buf[..], 0) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(NftError::Io(e)),
        }
    }
}
