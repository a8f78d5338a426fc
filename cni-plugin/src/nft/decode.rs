//! Live nf_tables rules → the rule model, so CHECK and the debug CLI compare and show rules in the
//! same terms they were written in. Only the vocabulary we emit is understood; anything else is
//! reported verbatim as drift rather than guessed at.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::nftables::{
    Bitwise, ChainAttribute, Cmp, DataAttribute, ExpressionAttribute, Expressions, Hook, HookNumber, Immediate,
    InetHookNumber, ListAttribute, Meta, MetaKey, Operator, Payload, Register, RuleAttribute, Verdict,
    VerdictAttribute,
};

use super::encode::{
    BASE_NETWORK, BASE_TRANSPORT, IPPROTO_TCP, NF_DROP, NFPROTO_IPV4, NFPROTO_IPV6, NFTA_REDIR_REG_PROTO_MIN,
    POLICY_ACCEPT, TCP_DPORT_OFFSET, addr_offset,
};
use crate::rules::{Action, BaseHook, ChainType, Match, Rule};
use crate::spec::PortRange;

const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;

/// A rule as found in the kernel: decoded, or the reason it could not be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRule {
    pub rule: Result<Rule, String>,
    pub packets: u64,
    pub bytes: u64,
}

/// What the single register we use holds between expressions.
#[derive(Debug, Clone)]
enum Loaded {
    Meta(MetaKey),
    Payload { base: u32, offset: u32, len: u32 },
    Masked { base: u32, offset: u32, mask: Vec<u8> },
    Immediate(Vec<u8>),
}

#[derive(Default)]
struct RuleDecoder {
    matches: Vec<Match>,
    loaded: Option<Loaded>,
    family: Option<u8>,
    range_start: Option<u16>,
    action: Option<Action>,
    packets: u64,
    bytes: u64,
}

fn nla_value(nla: &DefaultNla) -> Vec<u8> {
    let mut buf = vec![0; nla.value_len()];
    nla.emit_value(&mut buf);
    buf
}

fn be_u64(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

impl RuleDecoder {
    fn expression(&mut self, name: &str, data: &Expressions) -> Result<(), String> {
        match data {
            Expressions::Meta(attrs) => {
                let key = attrs.iter().find_map(|a| match a {
                    Meta::Key(k) => Some(*k),
                    _ => None,
                });
                self.loaded = Some(Loaded::Meta(key.ok_or("meta without key")?));
            }
            Expressions::Payload(attrs) => {
                let (mut base, mut offset, mut len) = (0, 0, 0);
                for a in attrs {
                    match a {
                        Payload::Base(v) => base = *v,
                        Payload::Offset(v) => offset = *v,
                        Payload::Len(v) => len = *v,
                        _ => {}
                    }
                }
                self.loaded = Some(Loaded::Payload { base, offset, len });
            }
            Expressions::Bitwise(attrs) => {
                let mask = attrs.iter().find_map(|a| match a {
                    Bitwise::Mask(DataAttribute::Value(m)) => Some(m.clone()),
                    _ => None,
                });
                match (self.loaded.take(), mask) {
                    (Some(Loaded::Payload { base, offset, .. }), Some(mask)) => {
                        self.loaded = Some(Loaded::Masked { base, offset, mask })
                    }
                    _ => return Err("bitwise on something other than a header field".into()),
                }
            }
            Expressions::Cmp(attrs) => {
                let mut op = None;
                let mut value = None;
                for a in attrs {
                    match a {
                        Cmp::Op(o) => op = Some(*o),
                        Cmp::Data(DataAttribute::Value(v)) => value = Some(v.clone()),
                        _ => {}
                    }
                }
                self.compare(op.ok_or("cmp without operator")?, value.ok_or("cmp without value")?)?;
            }
            Expressions::Immediate(attrs) => self.immediate(attrs)?,
            Expressions::Other { expression_type, attributes } if expression_type == "counter" => {
                for a in attributes {
                    match a.kind() {
                        NFTA_COUNTER_BYTES => self.bytes = be_u64(&nla_value(a)),
                        NFTA_COUNTER_PACKETS => self.packets = be_u64(&nla_value(a)),
                        _ => {}
                    }
                }
            }
            Expressions::Other { expression_type, attributes } if expression_type == "redir" => {
                let uses_reg = attributes.iter().any(|a| a.kind() == NFTA_REDIR_REG_PROTO_MIN);
                match self.loaded.take() {
                    Some(Loaded::Immediate(v)) if uses_reg && v.len() == 2 => {
                        self.action = Some(Action::Redirect(u16::from_be_bytes([v[0], v[1]])))
                    }
                    _ => return Err("redirect without a target port".into()),
                }
            }
            _ => return Err(format!("unrecognised expression `{name}`")),
        }
        Ok(())
    }

    fn immediate(&mut self, attrs: &[Immediate]) -> Result<(), String> {
        let to_verdict = attrs.iter().any(|a| matches!(a, Immediate::DestinationRegister(Register::Verdict)));
        for a in attrs {
            match a {
                Immediate::Data(DataAttribute::Verdict(v)) if to_verdict => {
                    let code = v.iter().find_map(|x| match x {
                        VerdictAttribute::Code(c) => Some(*c),
                        _ => None,
                    });
                    let chain = v.iter().find_map(|x| match x {
                        VerdictAttribute::Chain(c) => Some(c.clone()),
                        _ => None,
                    });
                    self.action = Some(match (code, chain) {
                        (Some(Verdict::Return), _) => Action::Return,
                        (Some(Verdict::Jump), Some(c)) => Action::Jump(c),
                        (Some(Verdict::Other(NF_DROP)), _) => Action::Drop,
                        (other, _) => return Err(format!("unexpected verdict {other:?}")),
                    });
                }
                Immediate::Data(DataAttribute::Value(v)) => self.loaded = Some(Loaded::Immediate(v.clone())),
                _ => {}
            }
        }
        Ok(())
    }

    fn compare(&mut self, op: Operator, value: Vec<u8>) -> Result<(), String> {
        let loaded = self.loaded.clone().ok_or("cmp with nothing loaded")?;
        let m = match (loaded, op) {
            (Loaded::Meta(MetaKey::L4Proto), Operator::Equal) if value == [IPPROTO_TCP] => Match::Tcp,
            (Loaded::Meta(MetaKey::Nfproto), Operator::Equal) if value.len() == 1 => {
                self.family = Some(value[0]);
                return Ok(());
            }
            (Loaded::Meta(MetaKey::SocketUserId), Operator::Equal) => Match::SkUid(ne_u32(&value)?),
            (Loaded::Meta(MetaKey::SocketGroupId), Operator::Equal) => Match::SkGid(ne_u32(&value)?),
            (Loaded::Meta(MetaKey::Oifname), Operator::Equal) => Match::OifName(ifname(&value)),
            (Loaded::Meta(MetaKey::Iifname), Operator::NotEqual) => Match::IifNameNot(ifname(&value)),
            (Loaded::Payload { base: BASE_TRANSPORT, offset: TCP_DPORT_OFFSET, len: 2 }, op) => {
                let port = u16::from_be_bytes(value.as_slice().try_into().map_err(|_| "bad port length")?);
                match op {
                    Operator::Equal => Match::DPort(PortRange::single(port)),
                    Operator::GreatherThanEqual => {
                        self.range_start = Some(port);
                        return Ok(());
                    }
                    Operator::LessThanEqual => {
                        let first = self.range_start.take().ok_or("port range without a start")?;
                        Match::DPort(PortRange { first, last: port })
                    }
                    other => return Err(format!("unexpected port comparison {other:?}")),
                }
            }
            (Loaded::Payload { base: BASE_NETWORK, offset, len }, Operator::Equal) => {
                let prefix = len * 8;
                self.address(offset, &value, prefix)?
            }
            (Loaded::Masked { base: BASE_NETWORK, offset, mask }, Operator::Equal) => {
                let prefix = mask.iter().map(|b| b.count_ones()).sum();
                self.address(offset, &value, prefix)?
            }
            (loaded, op) => return Err(format!("unexpected comparison {op:?} on {loaded:?}")),
        };
        // A port match implies the tcp dependency; remember it only once.
        self.matches.push(m);
        Ok(())
    }

    fn address(&mut self, offset: u32, value: &[u8], prefix: u32) -> Result<Match, String> {
        let v6 = match self.family.take() {
            Some(NFPROTO_IPV4) => false,
            Some(NFPROTO_IPV6) => true,
            _ => return Err("address match without an nfproto match".into()),
        };
        let full = if v6 { 16 } else { 4 };
        let mut bytes = value.to_vec();
        bytes.resize(full, 0);
        let addr: IpAddr = if v6 {
            Ipv6Addr::from(<[u8; 16]>::try_from(bytes.as_slice()).expect("sized")).into()
        } else {
            Ipv4Addr::from(<[u8; 4]>::try_from(bytes.as_slice()).expect("sized")).into()
        };
        let net = IpNet::new(addr, prefix as u8).map_err(|e| e.to_string())?;
        if offset == addr_offset(v6, true) {
            Ok(Match::SAddr(net))
        } else if offset == addr_offset(v6, false) {
            Ok(Match::DAddr(net))
        } else {
            Err(format!("unexpected network header offset {offset}"))
        }
    }

    fn finish(self) -> Result<Rule, String> {
        if self.family.is_some() || self.range_start.is_some() {
            return Err("incomplete match at end of rule".into());
        }
        let action = self.action.ok_or("rule without a verdict")?;
        Ok(Rule { matches: self.matches, action })
    }
}

/// A zero-padded interface name.
fn ifname(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

fn ne_u32(value: &[u8]) -> Result<u32, String> {
    value.try_into().map(u32::from_ne_bytes).map_err(|_| "bad id length".to_string())
}

/// Decodes one rule dump entry into (chain name, rule).
pub(super) fn decode_rule(attrs: &[RuleAttribute]) -> (String, LiveRule) {
    let mut chain = String::new();
    let mut decoder = RuleDecoder::default();
    let mut error = None;
    for attr in attrs {
        match attr {
            RuleAttribute::Chain(c) => chain = c.clone(),
            RuleAttribute::Expressions(list) => {
                for elem in list {
                    if let Err(e) = decode_element(&mut decoder, elem) {
                        error.get_or_insert(e);
                    }
                }
            }
            _ => {}
        }
    }
    let (packets, bytes) = (decoder.packets, decoder.bytes);
    let rule = match error {
        Some(e) => Err(e),
        None => decoder.finish(),
    };
    (chain, LiveRule { rule, packets, bytes })
}

fn decode_element(decoder: &mut RuleDecoder, elem: &ListAttribute<ExpressionAttribute>) -> Result<(), String> {
    let ListAttribute::Element(parts) = elem else {
        return Err("malformed expression list".into());
    };
    let name = parts
        .iter()
        .find_map(|p| match p {
            ExpressionAttribute::Name(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default();
    match parts.iter().find_map(|p| match p {
        ExpressionAttribute::Data(d) => Some(d),
        _ => None,
    }) {
        Some(data) => decoder.expression(&name, data),
        // Expressions without data (e.g. a bare counter) carry only their name.
        None if name == "counter" => Ok(()),
        None => Err(format!("unrecognised expression `{name}`")),
    }
}

/// A chain from a dump: its name and, for base chains, its hook and policy (or why it is not
/// what we write).
pub(super) fn decode_chain(attrs: &[ChainAttribute]) -> (String, Result<Option<BaseHook>, String>) {
    let name = attrs
        .iter()
        .find_map(|a| match a {
            ChainAttribute::Name(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let base = decode_base(&name, attrs);
    let policy = attrs.iter().find_map(|a| match a {
        ChainAttribute::Policy(p) => Some(*p),
        _ => None,
    });
    let base = match (base, policy) {
        // A base chain whose policy is not accept silently drops what our rules let through.
        (Ok(Some(_)), Some(p)) if p != POLICY_ACCEPT => {
            Err(format!("chain {name} has policy {}, not accept", policy_name(p)))
        }
        (base, _) => base,
    };
    (name, base)
}

fn policy_name(p: u32) -> String {
    match p {
        0 => "drop".into(),
        1 => "accept".into(),
        other => other.to_string(),
    }
}

fn decode_base(name: &str, attrs: &[ChainAttribute]) -> Result<Option<BaseHook>, String> {
    let mut hook = None;
    let mut priority = None;
    let mut kind = None;
    for attr in attrs {
        match attr {
            ChainAttribute::Type(t) => kind = Some(t.clone()),
            ChainAttribute::Hook(h) => {
                for x in h {
                    match x {
                        Hook::Number(HookNumber::Inet(n)) => hook = Some(*n),
                        Hook::Priority(p) => priority = Some(*p as i32),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(match (hook, priority) {
        (None, _) => None,
        (Some(h), Some(priority)) => {
            let kind = match kind.as_deref() {
                Some("nat") => ChainType::Nat,
                Some("filter") => ChainType::Filter,
                other => return Err(format!("chain {name} is of type {other:?}, not nat or filter")),
            };
            let hook = match h {
                InetHookNumber::PreRouting => crate::rules::Hook::Prerouting,
                InetHookNumber::LocalOut => crate::rules::Hook::Output,
                other => return Err(format!("chain {name} is on unexpected hook {other:?}")),
            };
            Some(BaseHook { kind, hook, priority })
        }
        (Some(_), None) => return Err(format!("chain {name} has a hook but no priority")),
    })
}
