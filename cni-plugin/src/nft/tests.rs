//! Encode → wire bytes → parse → decode must give back the rule: the decoder understands exactly
//! what the encoder writes. (The kernel round trip, and agreement with `nft` itself, are checked
//! by the root tests in tests/.)

use netlink_packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nftables::NfTablesMessage;
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};

use super::{decode, encode, frame};
use crate::rules::Ruleset;
use crate::spec::RedirectSpec;

fn wide_spec() -> RedirectSpec {
    RedirectSpec {
        proxy_gid: Some(2103),
        skip_inbound_ports: vec!["22".parse().unwrap(), "4567-4568".parse().unwrap()],
        skip_inbound_subnets: vec![
            "10.0.0.0/8".parse().unwrap(),
            "192.168.1.7/32".parse().unwrap(),
            "0.0.0.0/0".parse().unwrap(),
        ],
        skip_outbound_subnets: vec!["fd00::/20".parse().unwrap(), "2001:db8::/32".parse().unwrap()],
        ..Default::default()
    }
}

#[test]
fn every_rule_survives_the_wire() {
    let ruleset = Ruleset::from_spec(&wide_spec());
    for chain in &ruleset.chains {
        for rule in &chain.rules {
            let bytes = frame(encode::rule_message("cnimesh", &chain.name, rule), NetfilterProtoFamily::Inet, 0, 0, 1);
            let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&bytes).unwrap();
            let NetlinkPayload::InnerMessage(NetfilterMessage {
                inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewRule(m)),
                ..
            }) = msg.payload
            else {
                panic!("not a rule message");
            };
            let (decoded_chain, live) = decode::decode_rule(&m.attributes);
            assert_eq!(decoded_chain, chain.name);
            assert_eq!(live.rule.as_ref(), Ok(rule), "rule `{rule}`");
        }
    }
}

#[test]
fn chains_survive_the_wire() {
    let ruleset = Ruleset::from_spec(&RedirectSpec::default());
    for chain in &ruleset.chains {
        let bytes = frame(encode::chain_message("cnimesh", chain), NetfilterProtoFamily::Inet, 0, 0, 1);
        assert_eq!(NetlinkBuffer::new(&bytes).length() as usize, bytes.len());
        let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&bytes).unwrap();
        let NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewChain(m)),
            ..
        }) = msg.payload
        else {
            panic!("not a chain message");
        };
        assert_eq!(decode::decode_chain(&m.attributes), (chain.name.clone(), Ok(chain.base)));
    }
}

#[test]
fn redirect_is_sent_like_nft_sends_it() {
    // `nft --debug=netlink`: [ immediate reg 1 0x00002f10 ] [ redir proto_min reg 1 proto_max reg 1 flags 0x2 ]
    let ruleset = Ruleset::from_spec(&RedirectSpec::default());
    let inbound = ruleset.chain("inbound").unwrap();
    let bytes = frame(
        encode::rule_message("cnimesh", "inbound", inbound.rules.last().unwrap()),
        NetfilterProtoFamily::Inet,
        0,
        0,
        1,
    );
    let window = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(window(b"redir\0"));
    assert!(window(&[0x08, 0x00, 0x03, 0x00, 0, 0, 0, 2]), "flags=2 (NF_NAT_RANGE_PROTO_SPECIFIED)");
    assert!(window(&[0x10, 0x2f]), "port 4143 big-endian");
}
