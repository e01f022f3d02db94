//! Edge-side modules: [`edgehub`] keeps the WebSocket link to the cloud, [`metamanager`]
//! stores what the cloud sends in the [`store`] (KubeEdge's SQLite `meta` table) and
//! acknowledges it only once it is committed.

mod deliver;
pub mod edgehub;
pub mod metamanager;
pub mod remote;
pub mod store;
