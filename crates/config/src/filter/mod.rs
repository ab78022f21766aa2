//! The settings of a route's filters (`hsts:`, `allow:`, `rate_limit:`...): one module per filter,
//! holding how it is written, what it means, and its check.
//!
//! A filter's settings are route keys the rest of the schema does not read. Its module declares
//! them as a struct whose fields are those keys (`Section::Raw`), read from each route of the file
//! on its own (serde skips every other key), so a filter adds its keys without touching the route's
//! own struct; the unknown-key check and [`schema_keys`](crate::schema_keys) take the keys from the
//! same struct. `Section::check` turns what was written into the filter's settings, recording every
//! problem with its line and column as the rest of the checks do.
//!
//! # Adding a filter's settings
//!
//! 1. A module here: the `Raw` struct (its route keys, each an `Option<Spanned<...>>` with
//!    `#[serde(default)]`), the public settings type, and `impl Section` (`check`, `describe`).
//! 2. One line in the `sections!` list below: the field of [`Filters`] and the type.
//!
//! The proxy reads the settings from `route.filters.NAME`.

pub mod auth;
pub mod compress;
pub mod cors;
pub mod error_pages;
pub mod hedge;
pub mod hsts;
pub mod ip_list;
pub mod limit_methods;
pub mod max_request_body;
pub mod mirror;
pub mod rate_limit;
pub mod respond;

use crate::{
    checker::Checker,
    field::Field,
    raw::{fields_of, Shape},
};
use serde::de::DeserializeOwned;

/// What a filter's check may know of the route it is on.
pub(crate) struct RouteContext<'a> {
    /// The route's place in errors: `routes[2]`.
    pub(crate) field: &'a Field,
    /// The route has a `redirect:` (it answers itself; nothing reaches a backend), as written.
    pub(crate) redirect_written: bool,
    /// The route's `redirect:` was checked and holds: the route answers every request itself.
    pub(crate) redirects: bool,
    /// The names of the config's clusters, in order (a filter may name one).
    pub(crate) clusters: &'a [String],
    /// The clusters the route sends requests to (indexes into `clusters`), a split's weight-0 ones
    /// included: a reload may ramp them up. Empty when the route answers itself.
    pub(crate) sends_to: &'a [usize],
    /// The route splits its requests over several clusters.
    pub(crate) splits: bool,
}

/// A filter's settings: how they are written, and how they are checked.
pub(crate) trait Section: Sized {
    /// The route keys the filter reads, as written: a struct whose fields are those keys.
    type Raw: DeserializeOwned;

    /// The mappings under those keys, for the unknown-key check: `("hsts", &leaf::<RawHsts>())`.
    const SHAPES: &'static [(&'static str, &'static Shape)] = &[];

    /// The settings `raw` holds; `None` when the route uses none of the filter's keys, or after
    /// recording in `checker` why they are refused.
    fn check(checker: &mut Checker, raw: &Self::Raw, route: &RouteContext<'_>) -> Option<Self>;

    /// How `duet check` and `--diff` show the settings among the route's filters, after a space:
    /// `hsts max-age=600`.
    fn describe(&self) -> String;
}

/// One route of the file, as a filter reads it: only its own keys.
#[derive(serde::Deserialize)]
struct Routes<T> {
    #[serde(default = "Vec::new")]
    routes: Vec<T>,
}

/// What section `T` reads from every route of `text`, in the order of the routes.
fn read<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, serde_saphyr::Error> {
    serde_saphyr::from_str::<Routes<T>>(text).map(|file| file.routes)
}

/// Declares the filters' settings: [`Filters`], what they read ([`RawFilters`]), and their keys
/// ([`SHAPES`]). The list's order is the order `describe` writes them in.
macro_rules! sections {
    ($($field:ident: $module:ident::$settings:ident,)+) => {
        /// The settings of a route's filters, one field per filter: `None` when the route does not
        /// use it.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Filters {
            $(
                #[doc = concat!("See [`", stringify!($module), "::", stringify!($settings), "`].")]
                pub $field: Option<$module::$settings>,
            )+
        }

        impl Filters {
            /// Each filter's settings after a space, as `duet check` shows a route.
            pub(crate) fn describe(&self) -> String {
                let mut text = String::new();
                $(
                    if let Some(settings) = &self.$field {
                        text.push(' ');
                        text.push_str(&settings.describe());
                    }
                )+
                text
            }
        }

        /// What each filter read from every route of the file, in the order of the routes.
        pub(crate) struct RawFilters {
            $($field: Vec<<$module::$settings as Section>::Raw>,)+
        }

        impl RawFilters {
            /// Reads every filter's keys from `text`; the first value of the wrong kind stops it,
            /// as it stops serde everywhere.
            pub(crate) fn read(text: &str) -> Result<Self, serde_saphyr::Error> {
                Ok(Self {
                    $($field: read(text)?,)+
                })
            }

            /// The filters' settings of the route at `index`.
            pub(crate) fn check(
                &self,
                checker: &mut Checker,
                index: usize,
                route: &RouteContext<'_>,
            ) -> Filters {
                Filters {
                    $(
                        $field: self.$field.get(index).and_then(|raw| {
                            <$module::$settings as Section>::check(checker, raw, route)
                        }),
                    )+
                }
            }
        }

        /// The route keys each filter reads, with the mappings under them.
        pub(crate) static SHAPES: &[Shape] = &[
            $(Shape::new(
                fields_of::<<$module::$settings as Section>::Raw>,
                <$module::$settings as Section>::SHAPES,
            ),)+
        ];
    };
}

// The filters' settings, in the order `duet check` shows them.
sections! {
    hedge: hedge::Hedge,
    mirror: mirror::Mirror,
    hsts: hsts::Hsts,
    access: ip_list::Access,
    rate_limit: rate_limit::RateLimit,
    max_request_body: max_request_body::MaxRequestBody,
    auth: auth::Auth,
    respond: respond::Respond,
    error_pages: error_pages::ErrorPages,
    compress: compress::Compress,
    cors: cors::Cors,
    limit_methods: limit_methods::LimitMethods,
}

impl RawFilters {
    /// Whether the route at `index` answers itself (`respond:`), and so names no cluster.
    pub(crate) fn answers(&self, index: usize) -> bool {
        self.respond.get(index).is_some_and(respond::Keys::written)
    }
}
