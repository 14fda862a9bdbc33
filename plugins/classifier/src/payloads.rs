//! The text found in providers' real payloads, and the label it earns with the default keywords.
//!
//! Each fixture in `fixtures/` is a provider's documented example payload, trimmed to the fields
//! that matter plus some of the noise around them (ids, URLs, nested context objects), so a
//! lookup that reads the wrong field or stops too shallow fails here.

use crate::text::extract;

macro_rules! fixture {
    ($name:literal) => {
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/", $name)).as_slice()
    };
}

fn text(body: &[u8]) -> String {
    extract(body, None).unwrap()
}

fn label(body: &[u8]) -> String {
    crate::classify(&text(body), &crate::labels(None)).label
}

const INVOICE_PAYMENT_FAILED: &[u8] = fixture!("stripe-invoice.payment_failed.json");
const DISPUTE_CREATED: &[u8] = fixture!("stripe-charge.dispute.created.json");

#[test]
fn stripe_invoice_payment_failed_reads_the_type_and_line_items() {
    assert_eq!(
        text(INVOICE_PAYMENT_FAILED),
        "invoice payment failed\n1 × Pro (at $20.00 / month)"
    );
}

#[test]
fn stripe_invoice_payment_failed_is_billing() {
    assert_eq!(label(INVOICE_PAYMENT_FAILED), "billing");
}

#[test]
fn stripe_dispute_reads_the_type_and_reason() {
    assert_eq!(text(DISPUTE_CREATED), "charge dispute created\nfraudulent");
}

#[test]
fn stripe_dispute_is_billing() {
    assert_eq!(label(DISPUTE_CREATED), "billing");
}

#[test]
fn stripe_failed_charge_reads_the_failure_message_and_seller_message() {
    assert_eq!(
        text(fixture!("stripe-charge.failed.json")),
        "charge failed\n(created by Stripe CLI)\nYour card was declined.\n\
         The bank did not return any further details with this decline."
    );
}

#[test]
fn stripe_refund_reads_its_reasons_as_words() {
    assert_eq!(
        text(fixture!("stripe-charge.refund.updated.json")),
        "charge refund updated\nrequested by customer\nexpired or canceled card"
    );
}

#[test]
fn an_explicit_pointer_wins_over_the_stripe_shape() {
    let got = extract(INVOICE_PAYMENT_FAILED, Some("/data/object/metadata/ticket")).unwrap();
    assert_eq!(got, "T-1042");
}

#[test]
fn github_issue_reads_title_and_body_not_labels_or_repository() {
    assert_eq!(
        text(fixture!("github-issues.opened.json")),
        "Spelling error in the README file\n\
         It looks like you accidentally spelled 'commit' with two 't's."
    );
}

#[test]
fn github_issue_comment_reads_the_comment_not_the_issue() {
    assert_eq!(
        text(fixture!("github-issue_comment.created.json")),
        "You are totally right! I'll get this fixed right away."
    );
}

#[test]
fn github_pull_request_reads_title_and_body() {
    assert_eq!(
        text(fixture!("github-pull_request.opened.json")),
        "Update the README with new information.\n\
         This is a pretty simple change that we need to pull into master."
    );
}

#[test]
fn github_review_comment_reads_the_comment_not_the_diff() {
    assert_eq!(
        text(fixture!("github-pull_request_review_comment.created.json")),
        "Maybe you should use more emoji on this line."
    );
}

#[test]
fn github_review_without_a_body_reads_the_pull_request() {
    assert_eq!(
        text(fixture!("github-pull_request_review.submitted.json")),
        "Update the README with new information.\n\
         This is a pretty simple change that we need to pull into master."
    );
}

#[test]
fn github_push_reads_every_commit_message_once() {
    assert_eq!(
        text(fixture!("github-push.json")),
        "Test\nFix a crash when the config file is missing"
    );
}

#[test]
fn github_tag_push_reads_the_head_commit() {
    assert_eq!(text(fixture!("github-push.tag.json")), "commit 4");
}

#[test]
fn slack_message_reads_the_event_text_once() {
    assert_eq!(
        text(fixture!("slack-event_callback.message.json")),
        "Is there a way to replay a webhook that failed last night?"
    );
}

#[test]
fn shopify_cancelled_order_reads_the_note_and_reason() {
    assert_eq!(
        text(fixture!("shopify-orders.cancelled.json")),
        "I ordered the wrong size, please refund me\ncustomer"
    );
}
