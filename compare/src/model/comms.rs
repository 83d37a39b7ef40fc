//! The run's communicators as its manifest maps them (global ranks by communicator rank):
//! the one place compare and check read the world size, a communicator's members, the
//! groups of two or more ranks, and a group's siblings in a regular layout.

use ttrace_format::store::Manifest;

/// The world size the run was launched with: the largest the ranks reported when they
/// started, the largest communicator, or the ranks present (`present`), whichever is larger.
pub fn world_size(manifest: &Manifest, present: &[u32]) -> u32 {
    let present = present.iter().max().map_or(0, |r| r + 1);
    let reported = manifest
        .ranks
        .iter()
        .map(|r| r.world_size)
        .max()
        .unwrap_or(0);
    let largest_comm = manifest.comms.iter().map(|c| c.size).max().unwrap_or(0);
    reported.max(present).max(largest_comm)
}

/// The members (global ranks by communicator rank) of `comm`; `None` when the manifest does
/// not map it or lacks a member.
pub fn members(manifest: &Manifest, comm: u64) -> Option<Vec<u32>> {
    let c = manifest.comms.iter().find(|c| c.key == comm)?;
    c.members.iter().copied().collect()
}

/// Every communicator of two or more ranks with all its members known, as a sorted,
/// deduplicated set of global ranks; the sets themselves sorted and deduplicated.
pub fn groups(manifest: &Manifest) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = manifest
        .comms
        .iter()
        .filter_map(|c| c.members.iter().copied().collect::<Option<Vec<u32>>>())
        .map(|mut m| {
            m.sort_unstable();
            m.dedup();
            m
        })
        .filter(|m| m.len() >= 2)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The groups of the communicator family of `comm` that cover `ranks`: `comm`'s members,
/// and for every rank outside them the communicator whose members are the same set
/// translated by a rank offset (the sibling groups of a regular layout). `None` when a rank
/// has no such group.
pub fn sibling_groups(
    manifest: &Manifest,
    comm: u64,
    ranks: impl IntoIterator<Item = u32>,
) -> Option<Vec<Vec<u32>>> {
    let mut base = members(manifest, comm)?;
    base.sort_unstable();
    let sets: Vec<Vec<u32>> = manifest
        .comms
        .iter()
        .filter_map(|c| {
            let mut m = c.members.iter().copied().collect::<Option<Vec<u32>>>()?;
            m.sort_unstable();
            Some(m)
        })
        .collect();
    let mut out: Vec<Vec<u32>> = Vec::new();
    for rank in ranks {
        if out.iter().any(|g| g.contains(&rank)) {
            continue;
        }
        let found = base.iter().find_map(|&x| {
            let t: Vec<u32> = base
                .iter()
                .map(|&m| i64::from(m) + i64::from(rank) - i64::from(x))
                .filter(|v| *v >= 0)
                .map(|v| v as u32)
                .collect();
            (t.len() == base.len() && sets.contains(&t)).then_some(t)
        })?;
        out.push(found);
    }
    Some(out)
}

/// Whether a communicator of two or more ranks that `rank` belongs to has a member for
/// which `held` is false (not captured, or not mapped).
pub fn partners_missing(manifest: &Manifest, rank: u32, held: impl Fn(u32) -> bool) -> bool {
    manifest.comms.iter().any(|c| {
        c.size > 1
            && c.members.contains(&Some(rank))
            && c.members.iter().any(|m| m.is_none_or(|m| !held(m)))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ttrace_format::config::CaptureConfig;
    use ttrace_format::store::CommEntry;

    /// A manifest mapping `comms` (key, members) and nothing else.
    pub(crate) fn manifest(comms: &[(u64, Vec<Option<u32>>)]) -> Manifest {
        let mut m = Manifest {
            format_major: 1,
            format_minor: 0,
            run_id: "t".into(),
            created_unix_ns: 0,
            command: vec![],
            cwd: String::new(),
            env: Default::default(),
            config: CaptureConfig::default(),
            ranks: vec![],
            comms: vec![],
            finalized: true,
            exit_code: Some(0),
            job: None,
            lost: Vec::new(),
        };
        m.comms = comms
            .iter()
            .map(|(key, members)| CommEntry {
                key: *key,
                size: members.len() as u32,
                members: members.clone(),
                parent: None,
                color: None,
                api: "ncclCommInitRank".into(),
            })
            .collect();
        m
    }

    /// tp2 dp2, tensor-parallel fastest: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}.
    fn tp2_dp2() -> Manifest {
        let s = |v: &[u32]| v.iter().map(|&r| Some(r)).collect::<Vec<_>>();
        manifest(&[
            (0xa, s(&[0, 1])),
            (0xb, s(&[2, 3])),
            (0xc, s(&[0, 2])),
            (0xd, s(&[1, 3])),
        ])
    }

    #[test]
    fn the_world_is_the_largest_of_what_ranks_reported_communicators_and_ranks_present() {
        let m = tp2_dp2();
        assert_eq!(world_size(&m, &[0]), 2);
        assert_eq!(world_size(&m, &[0, 5]), 6);
    }

    #[test]
    fn a_communicators_siblings_are_its_members_translated_by_a_rank_offset() {
        let m = tp2_dp2();
        assert_eq!(
            sibling_groups(&m, 0xa, [0, 1, 2, 3]),
            Some(vec![vec![0, 1], vec![2, 3]])
        );
        assert_eq!(
            sibling_groups(&m, 0xc, [0, 1, 2, 3]),
            Some(vec![vec![0, 2], vec![1, 3]])
        );
        // No communicator holds rank 4's translate.
        assert_eq!(sibling_groups(&m, 0xa, [4]), None);
    }

    #[test]
    fn groups_are_the_distinct_known_sets_of_two_or_more_ranks() {
        let mut m = tp2_dp2();
        let copy = m.comms[0].clone();
        m.comms.push(copy);
        m.comms[1].members[1] = None;
        assert_eq!(groups(&m), vec![vec![0, 1], vec![0, 2], vec![1, 3]]);
    }

    #[test]
    fn a_rank_whose_group_partner_was_not_captured_misses_partners() {
        let m = tp2_dp2();
        assert!(partners_missing(&m, 0, |r| r != 1));
        assert!(!partners_missing(&m, 0, |r| r != 3));
    }
}
