//! Ruleset → nf_tables netlink messages, byte for byte what `nft -f` sends for the same rules
//! (see `nft --debug=netlink`): the kernel then lists them back in `nft`'s own words.

use ipnet::IpNet;
use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::nftables::{
    Bitwise, ChainAttribute, ChainMessage, Cmp, DataAttribute, Expressions, Hook, HookNumber, Immediate,
    InetHookNumber, Meta, MetaKey, NfTablesMessage, Operator, Payload, Register, RuleAttribute, RuleMessage,
    TableAttribute, TableMessage, Verdict, VerdictAttribute,
};

use crate::rules::{self, Action, Chain, Match, Rule, Ruleset};

/// `NF_ACCEPT`, the policy of our base chains.
pub(super) const POLICY_ACCEPT: u32 = 1;
/// `NF_DROP`, as a verdict code (the crate has no name for it).
pub(super) const NF_DROP: u32 = 0;

/// `NFT_PAYLOAD_NETWORK_HEADER` / `NFT_PAYLOAD_TRANSPORT_HEADER`.
pub(super) const BASE_NETWORK: u32 = 1;
pub(super) const BASE_TRANSPORT: u32 = 2;
/// Offset of the TCP destination port in the transport header.
pub(super) const TCP_DPORT_OFFSET: u32 = 2;
pub(super) const NFPROTO_IPV4: u8 = 2;
pub(super) const NFPROTO_IPV6: u8 = 10;
pub(super) const IPPROTO_TCP: u8 = 6;
/// `IFNAMSIZ`: interface names are compared as this many zero-padded bytes.
pub(super) const IFNAMSIZ: usize = 16;
/// `NFTA_REDIR_*` attributes and `NF_NAT_RANGE_PROTO_SPECIFIED`.
pub(super) const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
pub(super) const NFTA_REDIR_REG_PROTO_MAX: u16 = 2;
pub(super) const NFTA_REDIR_FLAGS: u16 = 3;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

pub(super) fn table_message(table: &str, with_flags: bool) -> NfTablesMessage {
    let mut attributes = vec![TableAttribute::Name(table.into())];
    if with_flags {
        attributes.push(TableAttribute::Flags(Default::default()));
    }
    NfTablesMessage::NewTable(TableMessage { attributes })
}

pub(super) fn delete_table_message(table: &str) -> NfTablesMessage {
    NfTablesMessage::DeleteTable(TableMessage { attributes: vec![TableAttribute::Name(table.into())] })
}

pub(super) fn chain_message(table: &str, chain: &Chain) -> NfTablesMessage {
    let mut attributes = vec![ChainAttribute::Table(table.into()), ChainAttribute::Name(chain.name.clone())];
    if let Some(base) = chain.base {
        let number = match base.hook {
            rules::Hook::Prerouting => InetHookNumber::PreRouting,
            rules::Hook::Output => InetHookNumber::LocalOut,
        };
        attributes.push(ChainAttribute::Hook(vec![
            Hook::Number(HookNumber::Inet(number)),
            // The kernel reads the priority as a big-endian s32.
            Hook::Priority(base.priority as u32),
        ]));
        attributes.push(ChainAttribute::Policy(POLICY_ACCEPT));
        attributes.push(ChainAttribute::Type(base.kind.to_string()));
    }
    NfTablesMessage::NewChain(ChainMessage { attributes })
}

pub(super) fn rule_message(table: &str, chain: &str, rule: &Rule) -> NfTablesMessage {
    NfTablesMessage::NewRule(RuleMessage {
        attributes: vec![
            RuleAttribute::Table(table.into()),
            RuleAttribute::Chain(chain.into()),
            RuleAttribute::Expressions(expressions(rule).into_iter().map(Into::into).collect()),
        ],
    })
}

/// Every message of a ruleset, in creation order (table, chains, then rules).
pub(super) fn ruleset_messages(table: &str, ruleset: &Ruleset) -> Vec<NfTablesMessage> {
    let mut out = vec![table_message(table, true)];
    out.extend(ruleset.chains.iter().map(|c| chain_message(table, c)));
    for chain in &ruleset.chains {
        out.extend(chain.rules.iter().map(|r| rule_message(table, &chain.name, r)));
    }
    out
}

fn expressions(rule: &Rule) -> Vec<Expressions> {
    let mut out = Vec::new();
    for m in &rule.matches {
        encode_match(m, &mut out);
    }
    out.push(Expressions::Other { expression_type: "counter".into(), attributes: vec![] });
    match &rule.action {
        Action::Return => out.push(verdict(vec![VerdictAttribute::Code(Verdict::Return)])),
        Action::Jump(chain) => {
            out.push(verdict(vec![VerdictAttribute::Code(Verdict::Jump), VerdictAttribute::Chain(chain.clone())]))
        }
        Action::Drop => out.push(verdict(vec![VerdictAttribute::Code(Verdict::Other(NF_DROP))])),
        Action::Redirect(port) => {
            out.push(Expressions::Immediate(vec![
                Immediate::DestinationRegister(Register::Reg1),
                Immediate::Data(DataAttribute::Value(port.to_be_bytes().to_vec())),
            ]));
            let reg = u32::from(Register::Reg1).to_be_bytes().to_vec();
            out.push(Expressions::Other {
                expression_type: "redir".into(),
                attributes: vec![
                    DefaultNla::new(NFTA_REDIR_REG_PROTO_MIN, reg.clone()),
                    DefaultNla::new(NFTA_REDIR_REG_PROTO_MAX, reg),
                    DefaultNla::new(NFTA_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED.to_be_bytes().to_vec()),
                ],
            });
        }
    }
    out
}

fn verdict(attrs: Vec<VerdictAttribute>) -> Expressions {
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(Register::Verdict),
        Immediate::Data(DataAttribute::Verdict(attrs)),
    ])
}

fn meta(key: MetaKey) -> Expressions {
    Expressions::Meta(vec![Meta::Key(key), Meta::DestinationRegister(Register::Reg1)])
}

fn cmp(op: Operator, data: Vec<u8>) -> Expressions {
    Expressions::Cmp(vec![Cmp::SourceRegister(Register::Reg1), Cmp::Op(op), Cmp::Data(DataAttribute::Value(data))])
}

fn payload(base: u32, offset: u32, len: u32) -> Expressions {
    Expressions::Payload(vec![
        Payload::DestinationRegister(Register::Reg1),
        Payload::Base(base),
        Payload::Offset(offset),
        Payload::Len(len),
    ])
}

fn encode_match(m: &Match, out: &mut Vec<Expressions>) {
    match m {
        Match::Tcp => {
            out.push(meta(MetaKey::L4Proto));
            out.push(cmp(Operator::Equal, vec![IPPROTO_TCP]));
        }
        Match::DPort(range) => {
            out.push(payload(BASE_TRANSPORT, TCP_DPORT_OFFSET, 2));
            if range.is_single() {
                out.push(cmp(Operator::Equal, range.first.to_be_bytes().to_vec()));
            } else {
                out.push(cmp(Operator::GreatherThanEqual, range.first.to_be_bytes().to_vec()));
                out.push(cmp(Operator::LessThanEqual, range.last.to_be_bytes().to_vec()));
            }
        }
        // skuid/skgid are loaded in host byte order.
        Match::SkUid(uid) => {
            out.push(meta(MetaKey::SocketUserId));
            out.push(cmp(Operator::Equal, uid.to_ne_bytes().to_vec()));
        }
        Match::SkGid(gid) => {
            out.push(meta(MetaKey::SocketGroupId));
            out.push(cmp(Operator::Equal, gid.to_ne_bytes().to_vec()));
        }
        Match::OifName(name) => {
            out.push(meta(MetaKey::Oifname));
            out.push(cmp(Operator::Equal, ifname_bytes(name)));
        }
        Match::IifNameNot(name) => {
            out.push(meta(MetaKey::Iifname));
            out.push(cmp(Operator::NotEqual, ifname_bytes(name)));
        }
        Match::SAddr(net) => encode_net(net, true, out),
        Match::DAddr(net) => encode_net(net, false, out),
    }
}

/// An interface name as `nft` compares it: zero-padded to [`IFNAMSIZ`] bytes.
fn ifname_bytes(name: &str) -> Vec<u8> {
    let mut padded = name.as_bytes().to_vec();
    padded.resize(IFNAMSIZ, 0);
    padded
}

/// Header offsets of the source address; the destination follows it.
pub(super) fn addr_offset(v6: bool, source: bool) -> u32 {
    match (v6, source) {
        (false, true) => 12,
        (false, false) => 16,
        (true, true) => 8,
        (true, false) => 24,
    }
}

fn encode_net(net: &IpNet, source: bool, out: &mut Vec<Expressions>) {
    let (v6, proto, addr) = match net {
        IpNet::V4(n) => (false, NFPROTO_IPV4, n.network().octets().to_vec()),
        IpNet::V6(n) => (true, NFPROTO_IPV6, n.network().octets().to_vec()),
    };
    out.push(meta(MetaKey::Nfproto));
    out.push(cmp(Operator::Equal, vec![proto]));
    let offset = addr_offset(v6, source);
    let prefix = usize::from(net.prefix_len());
    // Like nft: a byte-aligned prefix loads only its bytes; any other masks the whole address.
    if prefix > 0 && prefix % 8 == 0 {
        out.push(payload(BASE_NETWORK, offset, (prefix / 8) as u32));
        out.push(cmp(Operator::Equal, addr[..prefix / 8].to_vec()));
    } else {
        let mask = match net {
            IpNet::V4(n) => n.netmask().octets().to_vec(),
            IpNet::V6(n) => n.netmask().octets().to_vec(),
        };
        let len = addr.len();
        out.push(payload(BASE_NETWORK, offset, len as u32));
        out.push(Expressions::Bitwise(vec![
            Bitwise::SourceRegister(Register::Reg1),
            Bitwise::DestinationRegister(Register::Reg1),
            Bitwise::Length(len as u32),
            Bitwise::Mask(DataAttribute::Value(mask)),
            Bitwise::Xor(DataAttribute::Value(vec![0; len])),
        ]));
        out.push(cmp(Operator::Equal, addr));
    }
}
