//! The one list→watch→relist machinery every cloud controller and CloudHub's binding mirror
//! follow a kind with: [`KindWatcher`].
//!
//! It subscribes (watch) before it lists, so no change falls between the two; gives the
//! list's objects, then the watch's events; and lists again when the watch lagged (events
//! were lost, or the `kube` adapter listed again itself), when it closed, and after a list
//! that failed. It keeps what it last saw of each object (UID, resourceVersion and what the
//! caller chose to keep of it), so a list yields only differences: `Added` for an object it
//! had not seen, `Modified` for another UID or a newer version, `Deleted` (what was kept,
//! with the list's resourceVersion) for one the list lacks; and a watch event that is not
//! newer than what was seen (a change the list already brought), or deletes what was not
//! seen (a list told it gone, or an older object of the name), is not given.
//!
//! Backoff, one policy for all (`Backoff::standard`): a lag is relisted at once on the
//! same watch (it is healthy, only behind: waiting would put it further behind); a closed
//! watch or a failed list waits 100 ms, doubling to 30 s, then subscribes and lists again.
//! The wait starts over at 100 ms once the watch has run 60 s since its last good list.
//! Each relist is counted in `edgehive_watch_relists_total{module, kind, reason}`.
//!
//! [`KindWatcher::next`] is cancel-safe: a list under way and the watch are kept in the
//! watcher, so a controller may `select!` over several watchers (and its outbox) and take
//! the first change ready, without losing or restarting a list.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use edgehive_protocols::object::{is_newer, meta_str};
use futures_util::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Value};

use crate::cloud::cluster::{
    ClusterError, ClusterFuture, EventType, Listed, SharedCluster, Watch, WatchError, WatchEvent,
};
use crate::hive::Hive;

/// The first wait after a closed watch or a failed list.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(30);
/// A watch that ran this long since its last good list starts the waits over.
pub(crate) const HEALTHY: Duration = Duration::from_secs(60);

/// Why a watcher lists again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Relist {
    /// The watch fell behind: events were lost.
    Lagged,
    /// The cluster adapter listed again itself (the `kube` watcher at its start and after
    /// its own restarts): compare with what was seen.
    Relisted,
    /// The watch ended: subscribe again after the backoff.
    Closed,
    /// The list failed: subscribe and list again after the backoff.
    ListFailed,
}

impl Relist {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Relist::Lagged => "lagged",
            Relist::Relisted => "relisted",
            Relist::Closed => "closed",
            Relist::ListFailed => "list_failed",
        }
    }
}

/// What a [`KindWatcher`] gives.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A change the watch told.
    Event(WatchEvent),
    /// A difference a list found against what was last seen.
    Relisted(WatchEvent),
    /// A list is complete: every difference it found was given; what was seen is the
    /// cluster as of that list.
    Synced,
    /// The watch lagged, closed or a list failed: what was seen may be stale until the next
    /// [`Change::Synced`].
    Interrupted(Relist),
}

impl Change {
    /// The object change it carries, from the watch or a list alike.
    pub(crate) fn into_event(self) -> Option<WatchEvent> {
        match self {
            Change::Event(event) | Change::Relisted(event) => Some(event),
            Change::Synced | Change::Interrupted(_) => None,
        }
    }
}

/// The wait before subscribing again; see the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    healthy: Duration,
    next: Duration,
    healthy_since: Option<Instant>,
}

impl Backoff {
    /// Waits from `first` doubling to `max`, started over after `healthy` without trouble.
    pub(crate) fn new(first: Duration, max: Duration, healthy: Duration) -> Self {
        Backoff {
            first,
            max,
            healthy,
            next: first,
            healthy_since: None,
        }
    }

    /// `FIRST_RETRY` doubling to `MAX_RETRY`, started over after `HEALTHY`.
    pub(crate) fn standard() -> Self {
        Backoff::new(FIRST_RETRY, MAX_RETRY, HEALTHY)
    }

    /// A list succeeded at `now`: the watch is healthy from then on.
    pub(crate) fn listed(&mut self, now: Instant) {
        self.healthy_since.get_or_insert(now);
    }

    /// The wait before the next try, after a failure at `now`.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        if self
            .healthy_since
            .take()
            .is_some_and(|since| now.saturating_duration_since(since) >= self.healthy)
        {
            self.next = self.first;
        }
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RelistLabels {
    module: String,
    kind: String,
    reason: String,
}

/// The relist counter, one family per process; [`WatchMetrics::default`] counts into a
/// family nobody registered (tests).
#[derive(Debug, Clone, Default)]
pub struct WatchMetrics {
    relists: Family<RelistLabels, Counter>,
}

#[derive(Default)]
struct Registered(OnceLock<WatchMetrics>);

impl WatchMetrics {
    /// The process's family, registered with `hive`'s registry the first time.
    pub fn of(hive: &Hive) -> Self {
        hive.shared::<Registered>()
            .0
            .get_or_init(|| {
                let metrics = WatchMetrics::default();
                hive.metrics().register(
                    "edgehive_watch_relists",
                    "Lists of a watched kind after its first, by module, kind and reason (lagged: events lost; relisted: the kube adapter listed again; closed: the watch ended; list_failed)",
                    metrics.relists.clone(),
                );
                metrics
            })
            .clone()
    }

    /// How many relists `module` made of `kind` for `reason`.
    pub fn count(&self, module: &str, kind: &str, reason: Relist) -> u64 {
        self.relists
            .get_or_create(&RelistLabels {
                module: module.to_owned(),
                kind: kind.to_owned(),
                reason: reason.label().to_owned(),
            })
            .get()
    }

    fn inc(&self, module: &str, kind: &str, reason: Relist) {
        self.relists
            .get_or_create(&RelistLabels {
                module: module.to_owned(),
                kind: kind.to_owned(),
                reason: reason.label().to_owned(),
            })
            .inc();
    }
}

/// What is kept of an object beyond its identity: the part a `Deleted` found by a list
/// carries. Without one (the default), such a `Deleted` carries the identity only: `kind`
/// and the object's name, namespace and UID (nothing more is stored per object).
pub type Keep = fn(&Value) -> Value;

/// Keeps the whole object.
pub(crate) fn keep_all(object: &Value) -> Value {
    object.clone()
}

#[derive(Debug)]
struct Seen {
    uid: String,
    rv: String,
    /// What [`Keep`] kept, as compact JSON: a `Value` tree of even a small tombstone takes
    /// about ten times its text, once per object the watcher has seen.
    kept: Option<Box<str>>,
}

/// `keep` of `object`, as the text [`Seen`] holds.
fn kept_text(keep: Keep, object: &Value) -> Box<str> {
    keep(object).to_string().into_boxed_str()
}

type Key = (String, String);

fn key_of(object: &Value) -> Key {
    (
        meta_str(object, "namespace").to_owned(),
        meta_str(object, "name").to_owned(),
    )
}

/// A change waiting to be given: ready, or an object a list found, parsed when it is given
/// (a relist of a large kind holds texts, not trees; see [`Listed`]).
enum Pending {
    Ready(Change),
    Listed(EventType, Listed),
}

/// One kind followed through the cluster port; see the [module docs](self).
pub struct KindWatcher {
    cluster: SharedCluster,
    module: &'static str,
    kind: String,
    keep: Option<Keep>,
    metrics: WatchMetrics,
    backoff: Backoff,
    watch: Option<Watch>,
    /// A list under way (kept here so that a cancelled `next` does not restart it).
    listing: Option<ClusterFuture<(Vec<Listed>, String)>>,
    need_list: bool,
    /// Subscribe again no sooner than this.
    retry_at: Option<Instant>,
    seen: HashMap<Key, Seen>,
    pending: VecDeque<Pending>,
    /// The resourceVersion of the last complete list.
    listed_version: String,
}

impl std::fmt::Debug for KindWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindWatcher")
            .field("module", &self.module)
            .field("kind", &self.kind)
            .field("seen", &self.seen.len())
            .finish_non_exhaustive()
    }
}

impl KindWatcher {
    /// A watcher of `kind` for `module` (the metric's label) that has seen nothing; it
    /// subscribes and lists on the first [`KindWatcher::next`]. Keeps the objects' identity
    /// only (see [`Keep`]), uncounted, with `Backoff::standard`.
    pub fn new(cluster: SharedCluster, module: &'static str, kind: &str) -> Self {
        KindWatcher {
            cluster,
            module,
            kind: kind.to_owned(),
            keep: None,
            metrics: WatchMetrics::default(),
            backoff: Backoff::standard(),
            watch: None,
            listing: None,
            need_list: true,
            retry_at: None,
            seen: HashMap::new(),
            pending: VecDeque::new(),
            listed_version: String::new(),
        }
    }

    /// Keeps `keep` of each object for the `Deleted` a list finds.
    pub fn keeping(mut self, keep: Keep) -> Self {
        self.keep = Some(keep);
        self
    }

    /// Counts its relists in `metrics`.
    pub fn counted(mut self, metrics: WatchMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Waits by `backoff` instead of [`Backoff::standard`].
    #[cfg(test)]
    pub(crate) fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The kind it follows.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The resourceVersion of its last complete list (empty before the first): when it gives
    /// [`Change::Synced`], what it has seen is the cluster as of this version.
    pub fn listed_version(&self) -> &str {
        &self.listed_version
    }

    /// How many objects it has seen (that the cluster had at its last list or event).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether it has seen none.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Its changes as a stream, for an actor's `add_stream`.
    pub(crate) fn into_stream(self) -> futures_util::stream::BoxStream<'static, Change> {
        Box::pin(futures_util::stream::unfold(
            self,
            |mut watcher| async move {
                let change = watcher.next().await;
                Some((change, watcher))
            },
        ))
    }

    /// The next change; never ends (a closed watch is subscribed again). Cancel-safe.
    pub async fn next(&mut self) -> Change {
        loop {
            match self.pending.pop_front() {
                Some(Pending::Ready(change)) => return change,
                Some(Pending::Listed(event_type, listed)) => match listed.into_value() {
                    Some(object) => {
                        return Change::Relisted(WatchEvent { event_type, object });
                    }
                    None => {
                        // Its identity was read at the list, so this cannot be; skip it.
                        tracing::warn!(module = self.module, kind = %self.kind, "a listed object is not a JSON object; skipped");
                        continue;
                    }
                },
                None => {}
            }
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at.into()).await;
                self.retry_at = None;
            }
            if self.watch.is_none() {
                // Subscribe before listing so no change falls between the two.
                self.watch = Some(self.cluster.watch(&self.kind));
                self.need_list = true;
            }
            if self.need_list {
                let listing = self
                    .listing
                    .get_or_insert_with(|| self.cluster.list_lazily(&self.kind));
                let listed = listing.await;
                self.listing = None;
                match listed {
                    Ok((objects, version)) => {
                        self.need_list = false;
                        self.backoff.listed(Instant::now());
                        self.listed(objects, &version);
                    }
                    Err(error) => self.list_failed(&error),
                }
                continue;
            }
            let Some(watch) = self.watch.as_mut() else {
                continue;
            };
            match watch.next().await {
                Some(Ok(event)) => {
                    if let Some(event) = self.observe(event) {
                        return Change::Event(event);
                    }
                }
                Some(Err(WatchError::Lagged { skipped })) => {
                    let reason = if skipped > 0 {
                        tracing::warn!(module = self.module, kind = %self.kind, skipped, "watch lagged; listing again");
                        Relist::Lagged
                    } else {
                        tracing::debug!(module = self.module, kind = %self.kind, "watch listed; comparing with what was seen");
                        Relist::Relisted
                    };
                    self.interrupted(reason);
                    self.need_list = true;
                }
                Some(Err(WatchError::Closed)) | None => {
                    let wait = self.backoff.failed(Instant::now());
                    tracing::info!(module = self.module, kind = %self.kind, ?wait, "watch ended; subscribing again");
                    self.restart_after(wait);
                    self.interrupted(Relist::Closed);
                }
            }
        }
    }

    fn interrupted(&mut self, reason: Relist) {
        self.metrics.inc(self.module, &self.kind, reason);
        self.pending
            .push_back(Pending::Ready(Change::Interrupted(reason)));
    }

    fn restart_after(&mut self, wait: Duration) {
        self.watch = None;
        self.need_list = true;
        self.retry_at = Some(Instant::now() + wait);
    }

    fn list_failed(&mut self, error: &ClusterError) {
        let wait = self.backoff.failed(Instant::now());
        tracing::warn!(module = self.module, kind = %self.kind, %error, ?wait, "cannot list; keeping what was seen");
        self.restart_after(wait);
        self.interrupted(Relist::ListFailed);
    }

    /// A watch event: given unless it is not newer than what was seen of the same object.
    fn observe(&mut self, event: WatchEvent) -> Option<WatchEvent> {
        let key = key_of(&event.object);
        let uid = meta_str(&event.object, "uid");
        if event.event_type == EventType::Deleted {
            // Of what was seen, or not told at all: a list already told it gone, or it
            // is an older object of that name than the one seen.
            if self.seen.get(&key).is_some_and(|seen| seen.uid == uid) {
                self.seen.remove(&key);
                return Some(event);
            }
            return None;
        }
        let rv = meta_str(&event.object, "resourceVersion");
        if let Some(seen) = self.seen.get(&key) {
            if seen.uid == uid && !is_newer(rv, &seen.rv) {
                return None;
            }
        }
        let seen = Seen {
            uid: uid.to_owned(),
            rv: rv.to_owned(),
            kept: self.keep.map(|keep| kept_text(keep, &event.object)),
        };
        self.seen.insert(key, seen);
        Some(event)
    }

    /// A list: its differences with what was seen, then [`Change::Synced`].
    fn listed(&mut self, objects: Vec<Listed>, version: &str) {
        let mut present = HashSet::with_capacity(objects.len());
        for object in objects {
            let Some(id) = object.identity() else {
                tracing::warn!(module = self.module, kind = %self.kind, "a listed object is not a JSON object; skipped");
                continue;
            };
            let key = (id.namespace, id.name);
            present.insert(key.clone());
            let (uid, rv) = (id.uid, id.resource_version);
            let event_type = match self.seen.get(&key) {
                None => EventType::Added,
                Some(seen) if seen.uid != uid || is_newer(&rv, &seen.rv) => EventType::Modified,
                Some(_) => continue,
            };
            // What is kept is made from the object now (parsed once more when it is given).
            let kept = self
                .keep
                .and_then(|keep| object.to_value().map(|value| kept_text(keep, &value)));
            self.seen.insert(key, Seen { uid, rv, kept });
            self.pending.push_back(Pending::Listed(event_type, object));
        }
        let gone: Vec<Key> = self
            .seen
            .keys()
            .filter(|key| !present.contains(*key))
            .cloned()
            .collect();
        for key in gone {
            let Some(seen) = self.seen.remove(&key) else {
                continue;
            };
            // Its last state is gone with the missed events: what was kept of it, at the
            // list's version.
            let kept = seen
                .kept
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .filter(Value::is_object);
            let mut object = kept.unwrap_or_else(|| {
                let (namespace, name) = &key;
                let mut metadata = json!({"name": name});
                if !namespace.is_empty() {
                    metadata["namespace"] = json!(namespace);
                }
                metadata["uid"] = json!(seen.uid);
                json!({"kind": self.kind, "metadata": metadata})
            });
            object["metadata"]["resourceVersion"] = Value::from(version);
            self.pending
                .push_back(Pending::Ready(Change::Relisted(WatchEvent {
                    event_type: EventType::Deleted,
                    object,
                })));
        }
        self.listed_version = version.to_owned();
        self.pending.push_back(Pending::Ready(Change::Synced));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cluster::ClusterPort;
    use std::sync::Arc;

    type Faulty = crate::cloud::cluster::FaultyCluster;

    fn config(name: &str, data: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default"}, "data": {"v": data}})
    }

    /// A short backoff, so the tests wait milliseconds (the policy itself is tested alone).
    fn quick() -> Backoff {
        Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(8),
            Duration::from_secs(60),
        )
    }

    async fn next(watcher: &mut KindWatcher) -> Change {
        tokio::time::timeout(Duration::from_secs(30), watcher.next())
            .await
            .expect("a change within 30 s")
    }

    /// The changes up to the next `Synced`, as (type, name, data) sorted, and the
    /// interruptions before them.
    async fn until_synced(
        watcher: &mut KindWatcher,
    ) -> (Vec<Relist>, Vec<(EventType, String, String)>) {
        let (mut interruptions, mut changes) = (Vec::new(), Vec::new());
        loop {
            match next(watcher).await {
                Change::Synced => break,
                Change::Interrupted(reason) => interruptions.push(reason),
                Change::Relisted(event) => changes.push((
                    event.event_type,
                    meta_str(&event.object, "name").to_owned(),
                    event.object["data"]["v"].as_str().unwrap_or("").to_owned(),
                )),
                Change::Event(event) => panic!("a watch event before the list ended: {event:?}"),
            }
        }
        changes.sort_by(|a, b| a.1.cmp(&b.1));
        (interruptions, changes)
    }

    async fn event(watcher: &mut KindWatcher) -> (EventType, String) {
        match next(watcher).await {
            Change::Event(event) => (event.event_type, meta_str(&event.object, "name").to_owned()),
            other => panic!("expected a watch event, got {other:?}"),
        }
    }

    /// The three faults of a watch, each followed by a list that yields exactly what changed
    /// meanwhile, and a watch whose events the list already brought gives none of them again.
    #[tokio::test]
    async fn a_closed_watch_a_failed_list_and_a_lag_each_relist_exactly_the_differences() {
        let cluster = Faulty::default();
        cluster.inner.apply(config("a", "1")).unwrap();
        cluster.inner.apply(config("b", "1")).unwrap();
        let metrics = WatchMetrics::default();
        let mut watcher = KindWatcher::new(Arc::new(cluster.clone()), "test", "ConfigMap")
            .keeping(keep_all)
            .counted(metrics.clone())
            .with_backoff(quick());

        let (interruptions, changes) = until_synced(&mut watcher).await;
        assert!(interruptions.is_empty());
        assert_eq!(
            changes,
            [
                (EventType::Added, "a".into(), "1".into()),
                (EventType::Added, "b".into(), "1".into())
            ]
        );
        assert_eq!(cluster.counts(), (1, 1), "subscribed once, listed once");
        cluster.inner.apply(config("c", "1")).unwrap();
        assert_eq!(event(&mut watcher).await, (EventType::Added, "c".into()));

        // 1. The watch closes; meanwhile a changes, b goes, d comes; c stays as it was.
        cluster.close_watches();
        assert_eq!(
            next(&mut watcher).await,
            Change::Interrupted(Relist::Closed)
        );
        cluster.inner.apply(config("a", "2")).unwrap();
        cluster
            .inner
            .delete("ConfigMap", Some("default"), "b")
            .unwrap();
        cluster.inner.apply(config("d", "1")).unwrap();
        let (interruptions, changes) = until_synced(&mut watcher).await;
        assert!(interruptions.is_empty());
        assert_eq!(
            changes,
            [
                (EventType::Modified, "a".into(), "2".into()),
                // What was kept of it: its last state, at the list's version.
                (EventType::Deleted, "b".into(), "1".into()),
                (EventType::Added, "d".into(), "1".into()),
            ]
        );
        assert_eq!(cluster.counts(), (2, 2), "subscribed again, then listed");
        assert_eq!(metrics.count("test", "ConfigMap", Relist::Closed), 1);

        // 2. A list fails (twice), while c changes: subscribed again after the backoff,
        // listed, and only c is told.
        cluster.fail_lists(2);
        cluster.close_watches();
        assert_eq!(
            next(&mut watcher).await,
            Change::Interrupted(Relist::Closed)
        );
        cluster.inner.apply(config("c", "2")).unwrap();
        let (interruptions, changes) = until_synced(&mut watcher).await;
        assert_eq!(interruptions, [Relist::ListFailed, Relist::ListFailed]);
        assert_eq!(changes, [(EventType::Modified, "c".into(), "2".into())]);
        assert_eq!(metrics.count("test", "ConfigMap", Relist::ListFailed), 2);
        let (watches, lists) = cluster.counts();
        assert_eq!(
            (watches, lists),
            (5, 5),
            "each failed list is followed by a new watch"
        );

        // 3. A real lag: more changes than a watch buffers, none read meanwhile. Of the
        // 1100 writes the list finds one difference per object written (e, and d's last
        // version), and the watch's older events it still holds are not told again.
        for round in 0..1100 {
            let name = if round % 2 == 0 { "e" } else { "d" };
            cluster
                .inner
                .apply(config(name, &round.to_string()))
                .unwrap();
        }
        cluster
            .inner
            .delete("ConfigMap", Some("default"), "a")
            .unwrap();
        let (interruptions, changes) = until_synced(&mut watcher).await;
        assert_eq!(interruptions, [Relist::Lagged]);
        assert_eq!(
            changes,
            [
                (EventType::Deleted, "a".into(), "2".into()),
                (EventType::Modified, "d".into(), "1099".into()),
                (EventType::Added, "e".into(), "1098".into()),
            ]
        );
        assert_eq!(metrics.count("test", "ConfigMap", Relist::Lagged), 1);
        assert_eq!(cluster.counts(), (5, 6), "a lag relists on the same watch");
        // What the watch still holds is older than the list (a's delete among it): nothing
        // of it is told; the next change is.
        let quiet = tokio::time::timeout(Duration::from_millis(300), watcher.next()).await;
        assert!(quiet.is_err(), "told again: {quiet:?}");
        cluster.inner.apply(config("f", "1")).unwrap();
        assert_eq!(event(&mut watcher).await, (EventType::Added, "f".into()));
        assert_eq!(watcher.len(), 4, "c, d, e, f");
    }

    /// On the embedded cluster a list gives the objects' texts (parsed only where a change is
    /// told): a lag's relist still tells exactly the differences, with the objects as
    /// written (escapes and all), and a delete it finds carries what was kept.
    #[tokio::test]
    async fn a_relist_of_the_embedded_cluster_tells_the_differences_from_its_texts() {
        let cluster = Arc::new(crate::cloud::cluster::EmbeddedCluster::new());
        cluster.apply(config("a", "1")).unwrap();
        cluster.apply(config("b", "q\"uote\n\u{e9}")).unwrap();
        let mut watcher = KindWatcher::new(cluster.clone(), "test", "ConfigMap").keeping(keep_all);
        let (_, changes) = until_synced(&mut watcher).await;
        assert_eq!(
            changes,
            [
                (EventType::Added, "a".into(), "1".into()),
                (EventType::Added, "b".into(), "q\"uote\n\u{e9}".into())
            ]
        );
        // More changes than a watch buffers, none read meanwhile.
        for round in 0..1100 {
            let name = if round % 2 == 0 { "c" } else { "b" };
            cluster.apply(config(name, &format!("{round}\""))).unwrap();
        }
        cluster.delete("ConfigMap", Some("default"), "a").unwrap();
        let (interruptions, changes) = until_synced(&mut watcher).await;
        assert_eq!(interruptions, [Relist::Lagged]);
        assert_eq!(
            changes,
            [
                (EventType::Deleted, "a".into(), "1".into()),
                (EventType::Modified, "b".into(), "1099\"".into()),
                (EventType::Added, "c".into(), "1098\"".into()),
            ]
        );
        assert_eq!(watcher.len(), 2, "b and c");
    }

    /// The watcher's `next` may be dropped mid-way (a controller's `select!` takes another
    /// branch) while a list is under way: the list goes on, nothing is lost or told twice.
    #[tokio::test]
    async fn a_cancelled_next_keeps_its_list() {
        let cluster = Faulty::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        cluster.gate_lists(gate.clone());
        cluster.inner.apply(config("a", "1")).unwrap();
        let mut watcher = KindWatcher::new(Arc::new(cluster.clone()), "test", "ConfigMap");
        // Polled until the list waits, then dropped.
        let polled = futures_util::poll!(Box::pin(watcher.next()));
        assert!(polled.is_pending());
        cluster.inner.apply(config("b", "1")).unwrap();
        gate.add_permits(100);
        let (interruptions, changes) = until_synced(&mut watcher).await;
        assert!(interruptions.is_empty());
        let names: Vec<&str> = changes.iter().map(|change| change.1.as_str()).collect();
        assert_eq!(names, ["a"], "the list, taken when it was first polled");
        assert_eq!(event(&mut watcher).await, (EventType::Added, "b".into()));
        assert_eq!(cluster.counts(), (1, 1), "the same watch and list");
    }

    /// Without a [`Keep`], a delete a list finds carries the object's identity: what a
    /// follower needs to forget it, and nothing stored beyond the UID.
    #[tokio::test]
    async fn a_delete_found_by_a_list_carries_the_identity() {
        let cluster = Faulty::default();
        let created = cluster.inner.apply(config("a", "1")).unwrap();
        let mut watcher =
            KindWatcher::new(Arc::new(cluster.clone()), "test", "ConfigMap").with_backoff(quick());
        let (_, changes) = until_synced(&mut watcher).await;
        assert_eq!(changes.len(), 1);
        cluster.close_watches();
        assert_eq!(
            next(&mut watcher).await,
            Change::Interrupted(Relist::Closed)
        );
        cluster
            .inner
            .delete("ConfigMap", Some("default"), "a")
            .unwrap();
        let Change::Relisted(event) = next(&mut watcher).await else {
            panic!("expected the list's delete");
        };
        assert_eq!(event.event_type, EventType::Deleted);
        let (_, version) = ClusterPort::list(&cluster.inner, "ConfigMap")
            .await
            .unwrap();
        assert_eq!(
            event.object,
            json!({"kind": "ConfigMap", "metadata": {"name": "a", "namespace": "default",
                   "uid": created["metadata"]["uid"], "resourceVersion": version}})
        );
        assert_eq!(next(&mut watcher).await, Change::Synced);
        assert!(watcher.is_empty());
    }

    /// The wait doubles from the first to the cap and no further, and starts over after a
    /// healthy period.
    #[test]
    fn the_backoff_doubles_to_its_cap_and_starts_over_when_healthy() {
        let mut backoff = Backoff::standard();
        let now = Instant::now();
        let waits: Vec<Duration> = (0..12).map(|_| backoff.failed(now)).collect();
        assert_eq!(waits[0], FIRST_RETRY);
        assert_eq!(waits[1], FIRST_RETRY * 2);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert!(waits.iter().all(|wait| *wait <= MAX_RETRY));
        assert_eq!(waits[11], MAX_RETRY);
        // A good list, then trouble soon after: still at the cap.
        backoff.listed(now);
        assert_eq!(backoff.failed(now + Duration::from_secs(1)), MAX_RETRY);
        // A good list and a healthy minute: back to the first wait.
        backoff.listed(now);
        assert_eq!(backoff.failed(now + HEALTHY), FIRST_RETRY);
        assert_eq!(backoff.failed(now + HEALTHY), FIRST_RETRY * 2);
    }
}
