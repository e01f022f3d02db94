//! The plug: how a process built on this library starts extension modules, on the cloud
//! ([`CloudProcess::start_with`](crate::cloud::CloudProcess::start_with)) as on the edge
//! ([`EdgeProcess::start_with`](crate::edge::EdgeProcess::start_with)). See
//! docs/extending.md.
//!
//! A plug is a function given a [`Plug`]: the process's hive, on which it starts its modules
//! ([`Hive::start_module`]: registered by name and group, supervised and restarted like the
//! built-in ones, listed on `/api/v1/modules`), and the config sections of its extensions
//! (`modules.<name>` in `cloud.yaml` / `edge.yaml`, kept by the loader for the names given to
//! `load_files_with_extensions`). A section that no module of the plug reads is refused when
//! the process starts, naming its key, so a misspelt extension name is not silently ignored.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

#[cfg(feature = "cloud")]
use edgehive_actors::cloud::cluster::SharedCluster;
use edgehive_actors::hive::Hive;
use serde::de::DeserializeOwned;

/// What a plug gets: the hive to start its modules on and its modules' config sections.
pub struct Plug<'a> {
    hive: &'a Hive,
    sections: &'a BTreeMap<String, serde_json::Value>,
    read: RefCell<BTreeSet<String>>,
    #[cfg(feature = "cloud")]
    cluster: Option<SharedCluster>,
}

impl std::fmt::Debug for Plug<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plug")
            .field("hive", self.hive)
            .field("sections", self.sections)
            .finish_non_exhaustive()
    }
}

impl<'a> Plug<'a> {
    /// A plug for `hive` with the extension `sections` (`modules.<name>` by name).
    pub(crate) fn new(hive: &'a Hive, sections: &'a BTreeMap<String, serde_json::Value>) -> Self {
        Plug {
            hive,
            sections,
            read: RefCell::new(BTreeSet::new()),
            #[cfg(feature = "cloud")]
            cluster: None,
        }
    }

    /// The plug of a cloud, whose modules may read and write `cluster`.
    #[cfg(feature = "cloud")]
    pub(crate) fn with_cluster(mut self, cluster: SharedCluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// On the cloud, the cluster the built-in controllers use (the embedded one or the API
    /// server `kubeAPIConfig` names): an extension follows its kinds with
    /// `edgehive_actors::cloud::watcher::KindWatcher` and writes objects through it. `None`
    /// on the edge.
    #[cfg(feature = "cloud")]
    pub fn cluster(&self) -> Option<&SharedCluster> {
        self.cluster.as_ref()
    }

    /// The process's hive: start modules with [`Hive::start_module`], talk to the built-in
    /// modules by name (on the cloud, `edgehive_actors::cloud::contract::extension`).
    pub fn hive(&self) -> &'a Hive {
        self.hive
    }

    /// The section `modules.<name>` of the config as JSON, if the file has one; reading it
    /// claims it for the extension.
    pub fn section(&self, name: &str) -> Option<&'a serde_json::Value> {
        self.read.borrow_mut().insert(name.to_owned());
        self.sections.get(name)
    }

    /// The section `modules.<name>` read into `T` (its `Default` when the file has none); an
    /// error names the key (`modules.<name>.<key>`) and what was expected there.
    pub fn config<T: DeserializeOwned + Default>(&self, name: &str) -> anyhow::Result<T> {
        let Some(section) = self.section(name) else {
            return Ok(T::default());
        };
        serde_path_to_error::deserialize(section).map_err(|error| {
            let path = error.path().to_string();
            let key = if path == "." {
                format!("modules.{name}")
            } else {
                format!("modules.{name}.{path}")
            };
            anyhow::anyhow!("{key}: {}", error.inner())
        })
    }

    /// Fails on a section no module of the plug read: no extension claims it.
    pub(crate) fn finish(self) -> anyhow::Result<()> {
        let read = self.read.into_inner();
        let unclaimed: Vec<String> = self
            .sections
            .keys()
            .filter(|name| !read.contains(*name))
            .map(|name| format!("modules.{name}"))
            .collect();
        if unclaimed.is_empty() {
            return Ok(());
        }
        let claimed: Vec<&str> = read.iter().map(String::as_str).collect();
        anyhow::bail!(
            "{}: no extension module reads this config section (the plug's extensions read: {})",
            unclaimed.join(", "),
            if claimed.is_empty() {
                "none".to_owned()
            } else {
                claimed.join(", ")
            }
        )
    }
}
