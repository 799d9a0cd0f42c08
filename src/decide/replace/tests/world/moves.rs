//! What moves in a replacement world between passes: people (pods that
//! opt out, administrators' maintenances, the image, the windows, a client
//! that drops nodekeeper's fields, the autoscaler turned back on), the
//! autoscaler itself (adding workers, removing idle ones), the cloud's
//! instances and the drains.

use super::*;

impl World {
    pub(super) fn people_act(&mut self) {
        if self.other.is_some() && self.rng.chance(10) {
            let next = [Other::Done, Other::Busy, Other::Unknown][self.rng.below(3) as usize];
            self.trace.push(format!("the other NodeVersion: {next:?}"));
            self.other = Some(next);
        }
        let names: Vec<String> = self.nodes.iter().map(|n| n.name_any()).collect();
        if !names.is_empty() && self.rng.chance(8) {
            let n = names[self.rng.below(names.len() as u64) as usize].clone();
            self.trace.push(format!("{n}: a pod opts out"));
            self.opted_out.insert(n);
        }
        if !self.opted_out.is_empty() && self.rng.chance(15) {
            let i = self.rng.below(self.opted_out.len() as u64) as usize;
            if let Some(n) = self.opted_out.iter().nth(i).cloned() {
                self.trace.push(format!("{n}: the opted-out pod goes"));
                self.opted_out.remove(&n);
            }
        }
        if !names.is_empty() && self.rng.chance(4) {
            let n = names[self.rng.below(names.len() as u64) as usize].clone();
            let free = !self.nms.iter().any(|m| m.spec.node_name == n);
            if free {
                self.trace
                    .push(format!("{n}: an administrator's maintenance"));
                let mut m = NodeMaintenance::new(
                    &format!("admin-{n}"),
                    crate::api::nodemaintenance::NodeMaintenanceSpec {
                        node_name: n.clone(),
                        reason: Some("by hand".into()),
                    },
                );
                m.metadata.uid = Some(format!("uid-admin-{n}-{}", self.rv));
                m.metadata.resource_version = Some(self.bump());
                m.metadata.creation_timestamp = Some(Time(self.now));
                self.nms.push(m);
                self.admin.insert(n, 2 + self.rng.below(6) as u32);
            }
        }
        if self.rng.chance(6) {
            let (what, windows) = match self.rng.below(3) {
                0 => ("none", Vec::new()),
                1 => (
                    "five minutes of every ten",
                    vec![window("*/10 * * * *", "5m")],
                ),
                _ => ("a minute a year", vec![window("0 0 1 1 *", "1m")]),
            };
            self.trace.push(format!("windows: {what}"));
            self.nv.spec.windows = windows;
            self.nv.metadata.resource_version = Some(self.bump());
        }
        if let Some(st) = self.strategy.as_mut()
            && !st.spec.enabled
            && self.rng.chance(10)
        {
            self.trace
                .push("an administrator turns the autoscaler on".into());
            st.spec.enabled = true;
            self.rv += 1;
            st.metadata.resource_version = Some(self.rv.to_string());
        }
        if self.rng.chance(20) {
            self.trace
                .push("a client writes the NodeVersion without nodekeeper's fields".into());
            let image = self.nv.spec.image.clone();
            self.nv.spec = NodeVersionSpec {
                image,
                ..NodeVersionSpec::default_rollout()
            };
            self.nv.metadata.resource_version = Some(self.bump());
        }
        if self.nv.spec.image.as_deref() == Some("img-2") && self.rng.chance(2) {
            self.trace.push("the image changes to img-3".into());
            self.nv.spec.image = Some("img-3".into());
            self.nv.metadata.resource_version = Some(self.bump());
        }
    }

    /// The strategy's status follows its spec (nodekeeper scales the
    /// autoscaler's Deployment, then reports); while it runs (and people
    /// act) it adds a worker now and then, booting the group's image.
    pub(super) fn autoscaler_moves(&mut self) {
        let rv = self.bump();
        let Some(st) = self.strategy.as_mut() else {
            return;
        };
        // The other NodeVersion, busy, turns it off in its own pass.
        if self.other == Some(Other::Busy) && st.spec.enabled {
            st.spec.enabled = false;
            st.metadata.resource_version = Some(rv.clone());
            self.trace
                .push("the other NodeVersion turns the autoscaler off".into());
        }
        let running = st.status.as_ref().is_some_and(|x| x.enabled);
        if running != st.spec.enabled {
            st.status.get_or_insert_default().enabled = st.spec.enabled;
            st.metadata.resource_version = Some(rv);
            self.trace.push(format!(
                "the autoscaler {}",
                if st.spec.enabled { "runs" } else { "stops" }
            ));
            return;
        }
        if running && self.people && self.rng.chance(8) {
            self.serial += 1;
            let name = format!("a{}", self.serial);
            let image = self.group_images.get(GROUP).cloned().unwrap_or_default();
            self.trace
                .push(format!("the autoscaler adds {name} on {image}"));
            let instance = Instance {
                name: name.clone(),
                image,
                state: State::Creating(self.rng.below(3) as u32),
                request: None,
                group: GROUP.into(),
            };
            self.cloud.insert(format!("kwok://{name}"), instance);
            self.count += 1;
            self.scaled_up += 1;
        } else if running && self.people && self.rng.chance(6) {
            self.scale_down();
        }
    }

    /// The autoscaler removes a worker it finds idle: its Node goes, then
    /// its instance. Never a control plane, a node paired or in any
    /// maintenance, a surge node, nor the last two workers (its minimum).
    fn scale_down(&mut self) {
        let workers = self
            .nodes
            .iter()
            .filter(|n| !n.labels().contains_key(CONTROL_PLANE_LABEL))
            .count();
        let idle: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| !n.labels().contains_key(CONTROL_PLANE_LABEL))
            .filter(|n| {
                let a = n.annotations();
                !a.contains_key(HEIR_ANNOTATION) && !a.contains_key(DONOR_ANNOTATION)
            })
            .filter(|n| !self.nms.iter().any(|m| m.spec.node_name == n.name_any()))
            .filter(|n| {
                let pid = format!("kwok://{}", n.name_any());
                self.cloud.get(&pid).is_some_and(|i| i.request.is_none())
            })
            .map(|n| n.name_any())
            .collect();
        if workers <= 2 || idle.is_empty() {
            return;
        }
        let name = idle[self.rng.below(idle.len() as u64) as usize].clone();
        self.trace.push(format!("the autoscaler removes {name}"));
        self.nodes.retain(|n| n.name_any() != name);
        if let Some(i) = self.cloud.get_mut(&format!("kwok://{name}")) {
            i.state = State::Terminating(0);
        }
        self.count -= 1;
        self.scaled_down += 1;
    }

    /// Instances join and terminate; an administrator's maintenance ends.
    pub(super) fn cloud_moves(&mut self) {
        let mut joined = Vec::new();
        let mut gone = Vec::new();
        for (pid, i) in self.cloud.iter_mut() {
            i.state = match i.state {
                State::Creating(0) => {
                    joined.push((i.name.clone(), i.group.clone()));
                    State::Ready
                }
                State::Creating(n) => State::Creating(n - 1),
                State::Terminating(0) => {
                    gone.push(i.name.clone());
                    State::Terminated
                }
                State::Terminating(n) => State::Terminating(n - 1),
                ref s => s.clone(),
            };
            let _ = pid;
        }
        for (name, g) in joined {
            // A new node registers without the provider's annotations (a
            // control plane with its role's label, as kubeadm sets it).
            let mut n = if g == CP_GROUP {
                (*control_plane(&name, &g, "", &[])).clone()
            } else {
                (*node(&name, &g, "", &[])).clone()
            };
            n.metadata.annotations = None;
            n.metadata.resource_version = Some(self.bump());
            self.trace.push(format!("{name} joins"));
            self.nodes.push(n);
        }
        for name in gone {
            self.nodes.retain(|n| n.name_any() != name);
        }
        let ended: Vec<String> = self
            .admin
            .iter_mut()
            .filter_map(|(n, left)| {
                *left = left.saturating_sub(1);
                (*left == 0).then(|| n.clone())
            })
            .collect();
        for n in ended {
            self.admin.remove(&n);
            self.nms.retain(|m| m.name_any() != format!("admin-{n}"));
            self.trace
                .push(format!("{n}: the administrator's maintenance ends"));
        }
    }

    /// A drain takes a few steps; a pod that opted out after it began
    /// holds it.
    pub(super) fn drains_move(&mut self) {
        for m in self.nms.iter_mut() {
            let name = m.name_any();
            if name.starts_with("admin-") {
                continue;
            }
            let phase = m.status.as_ref().and_then(|s| s.phase);
            if phase.is_none() {
                self.draining
                    .insert(name.clone(), 1 + self.rng.below(3) as u32);
                m.status = Some(crate::api::nodemaintenance::NodeMaintenanceStatus {
                    phase: Some(Phase::Running),
                    ..Default::default()
                });
                continue;
            }
            if self.opted_out.contains(&m.spec.node_name) {
                continue;
            }
            if let Some(left) = self.draining.get_mut(&name) {
                if *left == 0 {
                    m.status = Some(crate::api::nodemaintenance::NodeMaintenanceStatus {
                        phase: Some(Phase::Succeeded),
                        ..Default::default()
                    });
                    self.draining.remove(&name);
                } else {
                    *left -= 1;
                }
            }
        }
    }
}

/// A window opening on `schedule` for `duration`. (Few openings a day:
/// a debug build reads a minute of every two 50 times slower than this.)
fn window(schedule: &str, duration: &str) -> crate::api::common::Window {
    serde_json::from_value(serde_json::json!({"schedule": schedule, "duration": duration}))
        .unwrap_or_else(|e| panic!("window {schedule}: {e}"))
}
