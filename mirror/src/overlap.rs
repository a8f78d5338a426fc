//! Links whose mirrors could share names. A mirror is `<service>-<cluster>`, so `s1-c1 == s2-c2`
//! with `c1 != c2` happens exactly when one cluster name is a `-`-suffix of the other (`west`
//! and `us-west`: west's `web-us` and us-west's `web` are both `web-us-west`); equal cluster
//! names share every name. Such a pair is refused, so mirror names stay injective whatever the
//! linked clusters export: of each pair, the Link created later (creationTimestamp, then name;
//! a Link without a timestamp counts as the oldest) is refused as a whole and mirrors nothing,
//! and the earlier one keeps working but never mirrors a name ending in `-<the longer name>`
//! (see [`super::plan`]). A Link is refused when it overlaps ANY earlier Link, refused or not,
//! so adding a Link never refuses one already admitted.
//!
//! Layer: model (pure).

use std::collections::BTreeMap;

use super::crd::Link;

/// Whether mirrors of clusters `a` and `b` can share a name: equal, or one ends in `-<other>`.
pub fn overlap(a: &str, b: &str) -> bool {
    let suffix = |long: &str, short: &str| long.strip_suffix(short).is_some_and(|head| head.ends_with('-'));
    a == b || suffix(a, b) || suffix(b, a)
}

/// One Link another Link overlaps with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The other Link's name.
    pub link: String,
    /// The other Link's target cluster name.
    pub cluster: String,
    /// Whether the Link this conflict is listed for is the refused one (created later).
    pub refused: bool,
}

/// For each Link (by name) that overlaps another, every such other Link; a Link with any entry
/// whose `refused` is true is refused.
pub fn conflicts(links: &[&Link]) -> BTreeMap<String, Vec<Conflict>> {
    let mut ordered: Vec<&Link> = links.to_vec();
    ordered.sort_by(|a, b| {
        (a.metadata.creation_timestamp.as_ref(), a.metadata.name.as_deref())
            .cmp(&(b.metadata.creation_timestamp.as_ref(), b.metadata.name.as_deref()))
    });
    let name = |l: &Link| l.metadata.name.clone().unwrap_or_default();
    let mut out: BTreeMap<String, Vec<Conflict>> = BTreeMap::new();
    for (i, later) in ordered.iter().enumerate() {
        for earlier in &ordered[..i] {
            if !overlap(&earlier.spec.target_cluster_name, &later.spec.target_cluster_name) {
                continue;
            }
            out.entry(name(later)).or_default().push(Conflict {
                link: name(earlier),
                cluster: earlier.spec.target_cluster_name.clone(),
                refused: true,
            });
            out.entry(name(earlier)).or_default().push(Conflict {
                link: name(later),
                cluster: later.spec.target_cluster_name.clone(),
                refused: false,
            });
        }
    }
    out
}

/// Why a Link is refused for its conflicts, in words (None when it is not).
pub fn refusal(cluster: &str, conflicts: &[Conflict]) -> Option<String> {
    let earlier: Vec<String> =
        conflicts.iter().filter(|c| c.refused).map(|c| format!("Link {} (cluster {:?})", c.link, c.cluster)).collect();
    (!earlier.is_empty()).then(|| {
        format!(
            "refused: cluster name {cluster:?} overlaps {} created earlier (one name is the other's or ends in '-' and it), so their mirrors <service>-<cluster> could share names; unlink one or link it under another name",
            earlier.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::tests::link;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn created(cluster: &str, at: &str) -> Link {
        let mut l = link(cluster);
        l.metadata.creation_timestamp = Some(Time(at.parse().unwrap()));
        l
    }

    #[test]
    fn cluster_names_overlap_when_equal_or_one_is_a_dash_suffix_of_the_other() {
        for (a, b) in [("west", "us-west"), ("us-west", "west"), ("west", "west"), ("a-b", "x-a-b")] {
            assert!(overlap(a, b), "{a} {b}");
        }
        for (a, b) in [("west", "uswest"), ("west", "east"), ("us-west", "us-east"), ("west", "west-1")] {
            assert!(!overlap(a, b), "{a} {b}");
        }
    }

    #[test]
    fn the_later_link_of_an_overlapping_pair_is_refused_and_both_name_the_other() {
        let west = created("west", "2026-01-01T00:00:00Z");
        let us_west = created("us-west", "2026-01-01T00:05:00Z");
        let east = created("east", "2026-01-01T00:01:00Z");
        let found = conflicts(&[&us_west, &east, &west]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found["us-west"], [Conflict { link: "west".into(), cluster: "west".into(), refused: true }]);
        assert_eq!(found["west"], [Conflict { link: "us-west".into(), cluster: "us-west".into(), refused: false }]);
        assert!(refusal("us-west", &found["us-west"]).unwrap().contains("Link west"));
        assert_eq!(refusal("west", &found["west"]), None);
        // Created the other way round: west is the one refused.
        let (west, us_west) = (created("west", "2026-01-01T00:05:00Z"), created("us-west", "2026-01-01T00:00:00Z"));
        assert!(conflicts(&[&west, &us_west])["west"][0].refused);
    }

    #[test]
    fn a_link_overlapping_a_refused_earlier_link_stays_refused_and_same_time_goes_by_name() {
        // us-west (oldest), west (refused), x-west (overlaps only west: refused too, so that
        // removing us-west admits west without refusing x-west's mirrors afterwards).
        let us_west = created("us-west", "2026-01-01T00:00:00Z");
        let west = created("west", "2026-01-01T00:01:00Z");
        let x_west = created("x-west", "2026-01-01T00:02:00Z");
        let found = conflicts(&[&x_west, &west, &us_west]);
        assert!(found["west"].iter().any(|c| c.refused) && found["x-west"].iter().any(|c| c.refused));
        assert!(found["us-west"].iter().all(|c| !c.refused));
        let (a, b) = (created("west", "2026-01-01T00:00:00Z"), created("us-west", "2026-01-01T00:00:00Z"));
        assert!(conflicts(&[&a, &b])["west"][0].refused, "us-west sorts first");
    }
}
