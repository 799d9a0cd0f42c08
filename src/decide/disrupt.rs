//! What every disruption feature (reboots, upgrades, replacement) shares,
//! pure: the node facts admissions read ([`node_facts`]), whether a node
//! may be taken now and why it waits ([`gates`]), and how a feature takes a
//! node — a NodeMaintenance it owns, carrying its drain options and the
//! boot ID the node was taken in — and gives back the nodes of an owner
//! that is gone ([`take`](mod@take)). Selector matching and checks are
//! [`crate::decide::selector`]'s.

pub mod gates;
pub mod node_facts;
pub mod take;

pub use gates::*;
pub use node_facts::*;
pub use take::*;

#[cfg(test)]
mod tests;
