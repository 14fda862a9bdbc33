//! The frame every dashboard page shares: document head (the embedded stylesheet and script),
//! the navigation with sign-out, and the small pieces pages repeat (a state badge, the CSRF
//! field, a time).
//!
//! Invariant: every page is built here from `maud` markup, so every value is escaped; the only
//! script a page loads is `/assets/app.js`, and a page works without it.

use maud::{DOCTYPE, Markup, html};

use super::{format, session::SignedIn};

/// The pages of the navigation, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Nav {
    Overview,
    Events,
    DeadLetters,
    Quarantine,
    Plugins,
}

impl Nav {
    const ALL: [Nav; 5] = [
        Nav::Overview,
        Nav::Events,
        Nav::DeadLetters,
        Nav::Quarantine,
        Nav::Plugins,
    ];

    fn label(self) -> &'static str {
        match self {
            Nav::Overview => "Overview",
            Nav::Events => "Events",
            Nav::DeadLetters => "Dead letters",
            Nav::Quarantine => "Quarantine",
            Nav::Plugins => "Plugins",
        }
    }

    fn href(self) -> &'static str {
        match self {
            Nav::Overview => "/",
            Nav::Events => "/events",
            Nav::DeadLetters => "/dead-letters",
            Nav::Quarantine => "/quarantine",
            Nav::Plugins => "/plugins",
        }
    }
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · hookd" }
            link rel="stylesheet" href="/assets/app.css";
            link rel="icon" href="/assets/icon.svg" type="image/svg+xml";
            script src="/assets/app.js" defer {}
        }
    }
}

/// A signed-in page: navigation (`current` marked), sign-out, then `body` under `title`.
pub(super) fn page(title: &str, current: Nav, signed_in: &SignedIn, body: Markup) -> Markup {
    framed(title, html! { (title) }, current, signed_in, body)
}

/// [`page`] titled `prefix` and then `chosen`, text a sender or a plugin chose (an event id, a
/// state key): isolated, so a bidi control in it reorders only it, in the heading (`<bdi>`)
/// and in the window's title (where no element can: between FSI and PDI).
pub(super) fn page_naming(
    prefix: &str,
    chosen: &str,
    current: Nav,
    signed_in: &SignedIn,
    body: Markup,
) -> Markup {
    let title = format!("{prefix}\u{2068}{chosen}\u{2069}");
    framed(
        &title,
        html! { (prefix) bdi { (chosen) } },
        current,
        signed_in,
        body,
    )
}

/// The frame of a signed-in page: `title` for the window, `heading` for its `h1`.
fn framed(
    title: &str,
    heading: Markup,
    current: Nav,
    signed_in: &SignedIn,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/" { "hookd" }
                    nav aria-label="Dashboard" {
                        ul {
                            @for item in Nav::ALL {
                                li {
                                    a href=(item.href())
                                        aria-current=[(item == current).then_some("page")] {
                                        (item.label())
                                    }
                                }
                            }
                        }
                    }
                    form.sign-out method="post" action="/sign-out" {
                        (csrf_field(signed_in))
                        button type="submit" { "Sign out" }
                    }
                }
                main #main {
                    h1 { (heading) }
                    (body)
                }
            }
        }
    }
}

/// A page outside the session: sign-in and errors.
pub(super) fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body.bare {
                main #main {
                    p.brand { "hookd" }
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The sign-in form, with `error` said above it.
pub(super) fn sign_in_form(error: Option<&str>) -> Markup {
    html! {
        @if let Some(error) = error {
            p.notice.error role="alert" { (error) }
        }
        form.stack method="post" action="/sign-in" {
            label for="token" { "Admin token" }
            input #token type="password" name="token" required autocomplete="current-password"
                autofocus;
            p.hint { "The " code { "server.admin_token" } " of hookd.toml, or the generated "
                code { "<database>.admin-token" } " file." }
            button type="submit" { "Sign in" }
        }
    }
}

/// The hidden field carrying the session's CSRF token, for every form that changes state.
pub(super) fn csrf_field(signed_in: &SignedIn) -> Markup {
    html! { input type="hidden" name="csrf" value=(signed_in.csrf); }
}

/// A delivery state (or attempt outcome) as a coloured badge that also reads as text.
pub(super) fn badge(state: &str) -> Markup {
    let class = match state {
        "done" | "ok" => "badge ok",
        "dead" | "permanent" | "trap" | "timeout" => "badge bad",
        "retrying" | "retry" | "stale" | "abandoned" | "conflict" => "badge warn",
        _ => "badge",
    };
    html! { span class=(class) { (state) } }
}

/// A UTC time with its machine-readable form.
pub(super) fn time(ms: i64) -> Markup {
    html! { time datetime=(format::utc(ms).replacen(' ', "T", 1) + "Z") { (format::utc(ms)) } }
}
