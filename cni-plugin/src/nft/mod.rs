//! The nftables backend: talks nf_tables netlink directly (no `nft` binary on the host).
//!
//! Everything that touches `netlink-packet-netfilter` lives under this module, because that crate
//! is young and pinned exactly: a change of its API should stay a local edit.
//!
//! A [`NftSocket`] is bound to the network namespace of the thread that opened it; callers open it
//! from inside the pod's netns (see [`crate::netns`]).

mod decode;
mod encode;
mod events;

use std::io;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkBuffer, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_netfilter::nftables::{ChainAttribute, ChainMessage};
use netlink_packet_netfilter::nftables::{
    NfTablesMessage, RuleAttribute, RuleMessage, TableAttribute, TableFlags, TableMessage,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

pub use decode::LiveRule;
pub use events::NftEvents;

use crate::rules::{self, BaseHook, Ruleset};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// Table name used by [`NftSocket::probe`]; never committed.
const PROBE_TABLE: &str = "cnimesh-probe";
/// Socket buffer sizes: our largest batch (see `spec::MAX_SKIP_ENTRIES`) must fit in one send.
const SOCKET_BUFFER: usize = 1 << 20;
/// How long to wait for the kernel to answer a request before declaring it stuck.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("netlink I/O failed: {0}")]
    Io(#[source] io::Error),
    #[error("the kernel rejected {what}: {source}")]
    Kernel {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse the kernel's reply: {0}")]
    Decode(String),
}

impl NftError {
    /// The kernel's errno, if the kernel answered with one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Whether retrying later may succeed (busy kernel, timeout, transient resource shortage).
    pub fn is_transient(&self) -> bool {
        match self {
            NftError::Io(e) => {
                matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)
                    || e.raw_os_error() == Some(libc::ENOBUFS)
            }
            NftError::Kernel { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENOMEM))
            }
            _ => false,
        }
    }
}

/// One chain of the live table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveChain {
    pub name: String,
    pub base: Result<Option<BaseHook>, String>,
    pub rules: Vec<LiveRule>,
}

/// The `inet cnimesh` table as the kernel has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTable {
    /// A dormant table is present but evaluates nothing: capture is off.
    pub dormant: bool,
    pub chains: Vec<LiveChain>,
}

/// A netfilter netlink socket in the current thread's network namespace.
pub struct NftSocket {
    socket: Socket,
    seq: u32,
}

fn frame(
    inner: impl Into<NetfilterMessageInner>,
    family: NetfilterProtoFamily,
    res_id: u16,
    flags: u16,
    seq: u32,
) -> Vec<u8> {
    let mut msg = NetlinkMessage::from(NetfilterMessage::new(NetfilterHeader::new(family, 0, res_id), inner));
    msg.header.flags = NLM_F_REQUEST | flags;
    msg.header.sequence_number = seq;
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

fn describe(msg: &NfTablesMessage) -> String {
    match msg {
        NfTablesMessage::NewTable(_) => format!("creating table inet {}", rules::TABLE),
        NfTablesMessage::DeleteTable(_) => format!("deleting table inet {}", rules::TABLE),
        NfTablesMessage::NewChain(ChainMessage { attributes }) => {
            let name = attributes.iter().find_map(|a| match a {
                ChainAttribute::Name(n) => Some(n.as_str()),
                _ => None,
            });
            format!("creating chain {}", name.unwrap_or("?"))
        }
        NfTablesMessage::NewRule(RuleMessage { attributes }) => {
            let chain = attributes.iter().find_map(|a| match a {
                RuleAttribute::Chain(n) => Some(n.as_str()),
                _ => None,
            });
            format!("adding a rule to chain {}", chain.unwrap_or("?"))
        }
        other => format!("{:?}", other.message_type()),
    }
}

impl NftSocket {
    pub fn open() -> Result<Self, NftError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NftError::Socket)?;
        socket.bind_auto().map_err(NftError::Socket)?;
        let timeout = nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as _, 0);
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| NftError::Socket(e.into()))?;
        // Best effort: the defaults (usually 208 KiB) already fit the largest batch we build.
        let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::SndBuf, &SOCKET_BUFFER);
        let _ = socket.set_rx_buf_sz(SOCKET_BUFFER);
        Ok(Self { socket, seq: std::process::id().wrapping_shl(12) })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Replaces the whole table with `ruleset` in one transaction: either the old table or the new
    /// one is in force, never a mix, and a failure leaves the netns as it was.
    pub fn replace(&mut self, ruleset: &Ruleset) -> Result<(), NftError> {
        // Fresh pods (the common case) have no table: create it exclusively. Deleting a table in a
        // transaction makes the kernel wait for an RCU grace period (~12 ms here), so the
        // delete-and-recreate form is kept for re-ADDs, where a table already exists.
        match self.transaction(ruleset_batch(rules::TABLE, ruleset, NLM_F_EXCL), Commit::Yes) {
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            other => return other,
        }
        // "add table; delete table; create everything" works whether or not the table exists.
        let mut msgs = vec![
            (encode::table_message(rules::TABLE, false), NLM_F_CREATE),
            (encode::delete_table_message(rules::TABLE), 0),
        ];
        msgs.extend(ruleset_batch(rules::TABLE, ruleset, 0));
        self.transaction(msgs, Commit::Yes)
    }

    /// Removes the table; succeeds when there is none.
    pub fn delete(&mut self) -> Result<(), NftError> {
        match self.transaction(vec![(encode::delete_table_message(rules::TABLE), 0)], Commit::Yes) {
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    /// Whether this kernel accepts our ruleset (an `inet` nat table with redirects needs Linux
    /// 5.2+), checked like `nft --check`: the batch is validated and then aborted.
    pub fn probe(&mut self) -> Result<(), NftError> {
        let ruleset = Ruleset::from_spec(&crate::spec::RedirectSpec::default());
        self.transaction(ruleset_batch(PROBE_TABLE, &ruleset, 0), Commit::No)
    }

    fn transaction(&mut self, msgs: Vec<(NfTablesMessage, u16)>, commit: Commit) -> Result<(), NftError> {
        let mut batch =
            frame(ControlMessage::BatchBegin, NetfilterProtoFamily::Unspec, NFNL_SUBSYS_NFTABLES, 0, self.next_seq());
        let mut pending = Vec::with_capacity(msgs.len());
        let count = msgs.len();
        for (i, (msg, flags)) in msgs.into_iter().enumerate() {
            let seq = self.next_seq();
            pending.push((seq, describe(&msg)));
            // Failures are always reported; only the last message asks for an ACK, so a large
            // batch cannot overflow the socket with ACKs (ENOBUFS after a successful commit).
            let ack = if i + 1 == count { NLM_F_ACK } else { 0 };
            batch.extend(frame(msg, NetfilterProtoFamily::Inet, 0, flags | ack, seq));
        }
        if commit == Commit::Yes {
            batch.extend(frame(
                ControlMessage::BatchEnd,
                NetfilterProtoFamily::Unspec,
                NFNL_SUBSYS_NFTABLES,
                0,
                self.next_seq(),
            ));
        }
        self.socket.send(&batch, 0).map_err(NftError::Io)?;

        // Read until the last message is answered, keeping the first error (the kernel goes on
        // validating after an error, then applies nothing).
        let last = pending.last().map(|(s, _)| *s).unwrap_or_default();
        let mut first_error = None;
        self.receive(|msg| {
            if let NetlinkPayload::Error(e) = &msg.payload {
                let seq = msg.header.sequence_number;
                let Some(code) = e.code else { return Ok(seq == last) };
                let source = io::Error::from_raw_os_error(-code.get());
                match pending.iter().find(|(s, _)| *s == seq) {
                    Some((_, what)) => {
                        first_error.get_or_insert(NftError::Kernel { what: what.clone(), source });
                        return Ok(seq == last);
                    }
                    // An error on the batch itself (e.g. EPERM without CAP_NET_ADMIN) ends it:
                    // no per-message answers follow.
                    None => {
                        first_error.get_or_insert(NftError::Kernel { what: "the transaction".into(), source });
                        return Ok(true);
                    }
                }
            }
            Ok(false)
        })?;
        first_error.map_or(Ok(()), Err)
    }

    /// Reads the table back; `None` when it does not exist.
    pub fn read(&mut self) -> Result<Option<LiveTable>, NftError> {
        let seq = self.next_seq();
        let get =
            NfTablesMessage::GetTable(TableMessage { attributes: vec![TableAttribute::Name(rules::TABLE.into())] });
        self.socket.send(&frame(get, NetfilterProtoFamily::Inet, 0, NLM_F_ACK, seq), 0).map_err(NftError::Io)?;
        let mut missing = false;
        let mut dormant = false;
        self.receive(|msg| match &msg.payload {
            NetlinkPayload::Error(e) => {
                if let Some(code) = e.code {
                    if -code.get() == libc::ENOENT {
                        missing = true;
                    } else {
                        return Err(NftError::Kernel {
                            what: "reading the table".into(),
                            source: io::Error::from_raw_os_error(-code.get()),
                        });
                    }
                }
                Ok(true)
            }
            NetlinkPayload::InnerMessage(NetfilterMessage {
                inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewTable(TableMessage { attributes })),
                ..
            }) => {
                dormant =
                    attributes.iter().any(|a| matches!(a, TableAttribute::Flags(f) if f.contains(TableFlags::Dormant)));
                Ok(false)
            }
            _ => Ok(false),
        })?;
        if missing {
            return Ok(None);
        }

        let mut chains = Vec::new();
        let get =
            NfTablesMessage::GetChain(ChainMessage { attributes: vec![ChainAttribute::Table(rules::TABLE.into())] });
        self.dump(get, |inner| {
            if let NfTablesMessage::NewChain(ChainMessage { attributes }) = inner
                && in_our_table(attributes.iter().find_map(|a| match a {
                    ChainAttribute::Table(t) => Some(t),
                    _ => None,
                }))
            {
                let (name, base) = decode::decode_chain(attributes);
                chains.push(LiveChain { name, base, rules: Vec::new() });
            }
        })?;

        let get = NfTablesMessage::GetRule(RuleMessage { attributes: vec![RuleAttribute::Table(rules::TABLE.into())] });
        self.dump(get, |inner| {
            if let NfTablesMessage::NewRule(RuleMessage { attributes }) = inner
                && in_our_table(attributes.iter().find_map(|a| match a {
                    RuleAttribute::Table(t) => Some(t),
                    _ => None,
                }))
            {
                let (chain, rule) = decode::decode_rule(attributes);
                if let Some(c) = chains.iter_mut().find(|c| c.name == chain) {
                    c.rules.push(rule);
                }
            }
        })?;
        Ok(Some(LiveTable { dormant, chains }))
    }

    fn dump(&mut self, request: NfTablesMessage, mut each: impl FnMut(&NfTablesMessage)) -> Result<(), NftError> {
        let seq = self.next_seq();
        self.socket.send(&frame(request, NetfilterProtoFamily::Inet, 0, NLM_F_DUMP, seq), 0).map_err(NftError::Io)?;
        self.receive(|msg| match &msg.payload {
            NetlinkPayload::Done(_) => Ok(true),
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => Err(NftError::Kernel {
                    what: "dumping the table".into(),
                    source: io::Error::from_raw_os_error(-code.get()),
                }),
                None => Ok(true),
            },
            NetlinkPayload::InnerMessage(NetfilterMessage { inner: NetfilterMessageInner::NfTables(m), .. }) => {
                each(m);
                Ok(false)
            }
            _ => Ok(false),
        })
    }

    /// Feeds every received message to `handle` until it returns `true`.
    fn receive(
        &mut self,
        mut handle: impl FnMut(&NetlinkMessage<NetfilterMessage>) -> Result<bool, NftError>,
    ) -> Result<(), NftError> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.socket.recv(&mut &mut buf[..], 0).map_err(|e| {
                if e.kind() == io::ErrorKind::WouldBlock {
                    NftError::Io(io::Error::new(io::ErrorKind::TimedOut, "no answer from the kernel"))
                } else {
                    NftError::Io(e)
                }
            })?;
            let mut offset = 0;
            while offset < n {
                let len = NetlinkBuffer::new_checked(&buf[offset..n])
                    .map_err(|e| NftError::Decode(e.to_string()))?
                    .length() as usize;
                if len == 0 {
                    break;
                }
                let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[offset..offset + len])
                    .map_err(|e| NftError::Decode(e.to_string()))?;
                if handle(&msg)? {
                    return Ok(());
                }
                // Netlink messages are 4-byte aligned.
                offset += (len + 3) & !3;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    Yes,
    /// Validate only: the batch has no end marker, so the kernel aborts it.
    No,
}

/// The messages creating `ruleset` in `table`; `table_flags` go on the table (e.g. `NLM_F_EXCL`).
fn ruleset_batch(table: &str, ruleset: &Ruleset, table_flags: u16) -> Vec<(NfTablesMessage, u16)> {
    encode::ruleset_messages(table, ruleset)
        .into_iter()
        .map(|m| {
            let flags = match m {
                NfTablesMessage::NewRule(_) => NLM_F_CREATE | NLM_F_APPEND,
                NfTablesMessage::NewTable(_) => NLM_F_CREATE | table_flags,
                _ => NLM_F_CREATE,
            };
            (m, flags)
        })
        .collect()
}

fn in_our_table(table: Option<&String>) -> bool {
    table.is_some_and(|t| t == rules::TABLE)
}

#[cfg(test)]
mod tests;
