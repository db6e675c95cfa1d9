"""tests/infra/iam_eval.py against the examples in AWS's IAM User Guide.

Sources (awsdocs/iam-user-guide, doc_source/):
- reference_policies_evaluation-logic.md (commit 149cf97fe14b7e6d388636b7b387b3149232e7b5):
  requests are denied by default; an allow in an identity or resource policy overrides
  that; an explicit deny in any policy overrides any allow.
- reference_policies_elements_condition_operators.md (commit 0727b4d20a1c31c0a52fd05bbc27d501ef62d99b):
  the StringEquals/PrincipalTag, Bool/SecureTransport, ArnLike-vs-StringLike, IfExists
  (RunInstances/InstanceType) and Null (TokenIssueTime) examples, and "a key absent from
  the request makes the condition false, true for a negated operator".
- reference_policies_multi-value-conditions.md (commit 027b8db402bace77fecac7af2dad2e5296bd0508):
  the ForAllValues / ForAnyValue DynamoDB examples and the empty-set rule.
"""

from __future__ import annotations

import pytest

from tests.infra.iam_eval import (ALLOW, DENY, IMPLICIT_DENY, Request, arn_match, condition_holds, evaluate,
                                  glob_match)


def policy(*statements):
    return {"Version": "2012-10-17", "Statement": list(statements)}


# -------------------------------------------------------------- evaluation logic


def test_default_deny_when_nothing_allows():
    assert evaluate([], Request("s3:GetObject", "arn:aws:s3:::b/k")) == IMPLICIT_DENY
    other = policy({"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b"})
    assert evaluate([other], Request("s3:GetObject", "arn:aws:s3:::b/k")) == IMPLICIT_DENY


def test_explicit_deny_overrides_any_allow_in_any_policy():
    allow = policy({"Effect": "Allow", "Action": "s3:*", "Resource": "*"})
    deny = policy({"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::b/*"})
    assert evaluate([allow, deny], Request("s3:DeleteObject", "arn:aws:s3:::b/k")) == DENY
    assert evaluate([deny, allow], Request("s3:DeleteObject", "arn:aws:s3:::b/k")) == DENY
    assert evaluate([allow, deny], Request("s3:GetObject", "arn:aws:s3:::b/k")) == ALLOW


def test_identity_and_resource_policy_allows_add_up_in_one_account():
    identity = policy({"Effect": "Allow", "Action": "sqs:ReceiveMessage", "Resource": "*"})
    resource = policy({"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::111122223333:role/r"},
                       "Action": "sqs:SendMessage", "Resource": "*"})
    caller = "arn:aws:iam::111122223333:role/r"
    assert evaluate([identity, resource], Request("sqs:SendMessage", "arn:aws:sqs:r:1:q", principal=caller)) == ALLOW
    assert evaluate([resource], Request("sqs:SendMessage", "arn:aws:sqs:r:1:q")) == IMPLICIT_DENY  # anonymous


def test_principal_star_matches_every_caller_including_anonymous():
    resource = policy({"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "s3:GetObject", "Resource": "*"})
    assert evaluate([resource], Request("s3:GetObject", "arn:aws:s3:::b/k")) == ALLOW
    assert evaluate([policy({**resource["Statement"][0], "Principal": "*"})],
                    Request("s3:GetObject", "arn:aws:s3:::b/k")) == ALLOW


# -------------------------------------------------------------- condition operators (AWS examples)

ACCESS_KEY_POLICY = policy({"Effect": "Allow", "Action": "iam:*AccessKey*", "Resource": "arn:aws:iam::account-id:user/*",
                            "Condition": {"StringEquals": {"aws:PrincipalTag/job-category": "iamuser-admin"}}})


@pytest.mark.parametrize("context, decision", [
    ({"aws:PrincipalTag/job-category": "iamuser-admin"}, ALLOW),
    ({"aws:PrincipalTag/job-category": "developer"}, IMPLICIT_DENY),
    ({}, IMPLICIT_DENY),  # "If a user without the tag attempts ... the condition returns false"
    ({"AWS:PrincipalTag/Job-Category": "iamuser-admin"}, ALLOW),  # key names are case-insensitive
    ({"aws:PrincipalTag/job-category": "IAMUSER-ADMIN"}, IMPLICIT_DENY),  # StringEquals is case-sensitive
])
def test_string_equals_principal_tag_example(context, decision):
    req = Request("iam:CreateAccessKey", "arn:aws:iam::account-id:user/alice", context)
    assert evaluate([ACCESS_KEY_POLICY], req) == decision


def test_action_wildcards_and_case():
    assert glob_match("iam:*AccessKey*", "iam:UpdateAccessKey", ignore_case=True)
    assert glob_match("IAM:*accesskey*", "iam:ListAccessKeys", ignore_case=True)
    assert not glob_match("iam:*AccessKey*", "iam:CreateUser", ignore_case=True)
    assert glob_match("arn:aws:s3:::b/?", "arn:aws:s3:::b/k") and not glob_match("arn:aws:s3:::b/?", "arn:aws:s3:::b/kk")


def test_bool_secure_transport_deny_example():
    deny_http = policy({"Sid": "BooleanExample", "Action": "s3:*", "Effect": "Deny",
                        "Resource": ["arn:aws:s3:::DOC-EXAMPLE-BUCKET", "arn:aws:s3:::DOC-EXAMPLE-BUCKET/*"],
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}}})
    allow = policy({"Effect": "Allow", "Action": "s3:*", "Resource": "*"})
    obj = "arn:aws:s3:::DOC-EXAMPLE-BUCKET/report.csv"
    assert evaluate([deny_http, allow], Request("s3:GetObject", obj, {"aws:SecureTransport": "false"})) == DENY
    assert evaluate([deny_http, allow], Request("s3:GetObject", obj, {"aws:SecureTransport": "true"})) == ALLOW
    # "This policy does not allow any actions": alone it leaves the default deny.
    assert evaluate([deny_http], Request("s3:GetObject", obj, {"aws:SecureTransport": "true"})) == IMPLICIT_DENY


def test_arn_like_matches_each_arn_part_separately_unlike_string_like():
    pattern = "arn:aws:someservice:*:111122223333:finance/*"
    value = "arn:aws:someservice:us-east-2:999999999999:store/abc:111122223333:finance/document.txt"
    assert condition_holds("StringLike", "aws:SourceArn", pattern, {"aws:SourceArn": value})
    assert not condition_holds("ArnLike", "aws:SourceArn", pattern, {"aws:SourceArn": value})
    assert arn_match(pattern, "arn:aws:someservice:us-east-2:111122223333:finance/document.txt")


def test_missing_key_is_false_for_positive_and_true_for_negated_operators():
    assert not condition_holds("StringLike", "aws:PrincipalTag/team", "*", {})
    assert condition_holds("StringNotLike", "aws:PrincipalTag/team", "x*", {})
    assert condition_holds("ArnNotLike", "aws:SourceArn", "arn:aws:sns:*:*:t", {})


RUN_INSTANCES_DOES_NOT_WORK = policy({
    "Sid": "THISPOLICYDOESNOTWORK", "Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*",
    "Condition": {"StringLike": {"ec2:InstanceType": ["t1.*", "t2.*", "m3.*"]}}})
RUN_INSTANCES_IF_EXISTS = policy({
    "Sid": "RunInstance", "Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*",
    "Condition": {"StringLikeIfExists": {"ec2:InstanceType": ["t1.*", "t2.*", "m3.*"]}}})


@pytest.mark.parametrize("resource, context, plain, if_exists", [
    # The image, key pair, security group... have no ec2:InstanceType: only IfExists lets them through.
    ("arn:aws:ec2:us-east-1::image/ami-1", {}, IMPLICIT_DENY, ALLOW),
    ("arn:aws:ec2:us-east-1:1:instance/*", {"ec2:InstanceType": "t2.micro"}, ALLOW, ALLOW),
    ("arn:aws:ec2:us-east-1:1:instance/*", {"ec2:InstanceType": "m5.large"}, IMPLICIT_DENY, IMPLICIT_DENY),
])
def test_if_exists_example(resource, context, plain, if_exists):
    req = Request("ec2:RunInstances", resource, context)
    assert evaluate([RUN_INSTANCES_DOES_NOT_WORK], req) == plain
    assert evaluate([RUN_INSTANCES_IF_EXISTS], req) == if_exists


def test_deny_with_negated_if_exists_still_denies_when_the_key_is_missing():
    deny = policy({"Effect": "Deny", "Action": "ec2:*", "Resource": "*",
                   "Condition": {"StringNotEqualsIfExists": {"aws:ResourceTag/team": "blue"}}})
    allow = policy({"Effect": "Allow", "Action": "ec2:*", "Resource": "*"})
    assert evaluate([deny, allow], Request("ec2:StopInstances", "arn:aws:ec2:r:1:instance/i-1")) == DENY
    assert evaluate([deny, allow], Request("ec2:StopInstances", "arn:aws:ec2:r:1:instance/i-1",
                                           {"aws:ResourceTag/team": "blue"})) == ALLOW


def test_null_example_temporary_credentials():
    only_long_term = policy({"Action": "ec2:*", "Effect": "Allow", "Resource": "*",
                             "Condition": {"Null": {"aws:TokenIssueTime": "true"}}})
    req = Request("ec2:DescribeInstances", "*")
    assert evaluate([only_long_term], req) == ALLOW
    temporary = Request("ec2:DescribeInstances", "*", {"aws:TokenIssueTime": "2026-01-01T00:00:00Z"})
    assert evaluate([only_long_term], temporary) == IMPLICIT_DENY
    assert condition_holds("Null", "aws:TokenIssueTime", "false", temporary.context)


# -------------------------------------------------------------- set operators (AWS examples)

THREAD = "arn:aws:dynamodb:REGION:ACCOUNT-ID-WITHOUT-HYPHENS:table/Thread"
ONLY_SOME_ATTRIBUTES = policy({"Effect": "Allow", "Action": "GetItem", "Resource": THREAD,
                               "Condition": {"ForAllValues:StringLike": {
                                   "dynamodb:requestedAttributes": ["PostDateTime", "Message", "Tags"]}}})
NO_ID_UPDATES = policy({"Effect": "Deny", "Action": "PutItem", "Resource": THREAD,
                        "Condition": {"ForAnyValue:StringLike": {"dynamodb:requestedAttributes": ["ID", "PostDateTime"]}}})


def test_for_all_values_example():
    ok = Request("GetItem", THREAD, {"dynamodb:requestedAttributes": ["PostDateTime", "Message"]})
    assert evaluate([ONLY_SOME_ATTRIBUTES], ok) == ALLOW
    extra = Request("GetItem", THREAD, {"dynamodb:requestedAttributes": ["PostDateTime", "UserName"]})
    assert evaluate([ONLY_SOME_ATTRIBUTES], extra) == IMPLICIT_DENY


def test_for_any_value_example():
    hit = Request("PutItem", THREAD, {"dynamodb:requestedAttributes": ["UserName", "Message", "PostDateTime"]})
    assert evaluate([NO_ID_UPDATES], hit) == DENY
    miss = Request("PutItem", THREAD, {"dynamodb:requestedAttributes": ["UserName"]})
    assert evaluate([NO_ID_UPDATES], miss) == IMPLICIT_DENY  # not denied, but nothing allows it either


def test_empty_set_is_true_for_all_values_and_false_for_any_value():
    for context in ({}, {"aws:TagKeys": []}):
        assert condition_holds("ForAllValues:StringEquals", "aws:TagKeys", ["Name"], context)
        assert not condition_holds("ForAnyValue:StringEquals", "aws:TagKeys", ["Name"], context)


def test_unsupported_operators_are_refused_not_guessed():
    with pytest.raises(ValueError, match="NumericLessThan"):
        condition_holds("NumericLessThan", "s3:max-keys", "10", {"s3:max-keys": "5"})
    with pytest.raises(ValueError, match="several values"):
        condition_holds("StringEquals", "aws:TagKeys", "Name", {"aws:TagKeys": ["Name", "x"]})
