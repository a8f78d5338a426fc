//! The nftables backend: talks nf_tables netlink directly (no `nft` binary on the host).
//!
//! Everything that touches `netlink-packet-netfilter` lives under this module, because that crate
//! is young and pinned exactly: a change of its API should stay a local edit.
//!
//! A [`NftSocket`] is bound to the network namespace of the thread that opened it; callers open it
//! from inside the pod's netns (see [`crate::netns`]).

mod decode;
mod encode;

use std::io;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkBuffer, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_netfilter::nftables::{ChainAttribute, ChainMessage};
use netlink_packet_netfilter::nftables::{NfTablesMessage, RuleAttribute, RuleMessage, TableAttribute, TableMessage};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

pub use decode::LiveRule;

use crate::rules::{self, BaseHook, Ruleset};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
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
        match self.transaction(ruleset_batch(ruleset, NLM_F_EXCL)) {
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            other => return other,
        }
        // "add table; delete table; create everything" works whether or not the table exists.
        let mut msgs = vec![(encode::table_message(false), NLM_F_CREATE), (encode::delete_table_message(), 0)];
        msgs.extend(ruleset_batch(ruleset, 0));
        self.transaction(msgs)
    }

    /// Removes the table; succeeds when there is none.
    pub fn delete(&mut self) -> Result<(), NftError> {
        match self.transaction(vec![(encode::delete_table_message(), 0)]) {
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    fn transaction(&mut self, msgs: Vec<(NfTablesMessage, u16)>) -> Result<(), NftError> {
        let mut batch =
            frame(ControlMessage::BatchBegin, NetfilterProtoFamily::Unspec, NFNL_SUBSYS_NFTABLES, 0, self.next_seq());
        let mut pending = Vec::with_capacity(msgs.len());
        for (msg, flags) in msgs {
            let seq = self.next_seq();
            pending.push((seq, describe(&msg)));
            batch.extend(frame(msg, NetfilterProtoFamily::Inet, 0, flags | NLM_F_ACK, seq));
        }
        batch.extend(frame(
            ControlMessage::BatchEnd,
            NetfilterProtoFamily::Unspec,
            NFNL_SUBSYS_NFTABLES,
            0,
            self.next_seq(),
        ));
        self.socket.send(&batch, 0).map_err(NftError::Io)?;

        // Every message asked for an ACK: read until the last one is answered, keeping the first
        // error (later messages of a failed batch are answered too, then nothing is applied).
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
        Ok(Some(LiveTable { chains }))
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

/// The messages creating `ruleset`; `table_flags` go on the table (e.g. `NLM_F_EXCL`).
fn ruleset_batch(ruleset: &Ruleset, table_flags: u16) -> Vec<(NfTablesMessage, u16)> {
    encode::ruleset_messages(ruleset)
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
