//! The [`Method`] trait every method type implements, and the `method!` macro that declares
//! one (its wire name, capability, params and result).

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::protocol::capabilities::Capability;

/// A MAP request method.
pub trait Method {
    /// The wire name, e.g. `map/agents/list`.
    const NAME: &'static str;
    /// The capability a caller must hold (`meta.json`), if any.
    const CAPABILITY: Option<Capability>;
    /// Request params (absent params decode from `{}`).
    type Params: DeserializeOwned + JsonSchema + Send + 'static;
    /// Success result.
    type Result: Serialize + JsonSchema + Send + 'static;
}

macro_rules! method {
    ($(#[$m:meta])* $ty:ident, $name:literal, $cap:expr, $params:ty, $result:ty) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy)]
        pub struct $ty;
        impl $crate::protocol::methods::method::Method for $ty {
            const NAME: &'static str = $name;
            const CAPABILITY: Option<$crate::protocol::capabilities::Capability> = $cap;
            type Params = $params;
            type Result = $result;
        }
    };
}
pub(crate) use method;
