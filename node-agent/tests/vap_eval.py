#!/usr/bin/env python3
"""Decides admission requests the way the API server runs a ValidatingAdmissionPolicy.

Used by node-agent/tests/admission_policy.rs so that the policy's CEL is evaluated, not only
parsed. The CEL runtime is Google's (cel-cpp, via the `cel-expr-python` package on PyPI,
Apache-2.0; scripts/setup.sh installs it).

stdin:  {"policy": <the ValidatingAdmissionPolicy as JSON, or null for "no policy">,
         "cases": [{"name": str, "request": {...}, "object": {...} | null,
                    "oldObject": {...} | null}, ...]}
stdout: [{"name": str, "matched": bool, "allowed": bool, "messages": [str, ...]}, ...]

The order and rules are Kubernetes' (admissionregistration.k8s.io/v1):
  1. matchConstraints.resourceRules select the request (group, version, resource/subresource,
     operation); an unselected request is allowed and not matched.
  2. matchConditions: one false skips the policy (allowed, not matched); otherwise one error
     applies failurePolicy.
  3. variables are evaluated in order, each seeing the earlier ones; an error in one is an
     error of every validation that reads it (the API server evaluates them lazily).
  4. every validation must be true; false denies with its message, an error applies
     failurePolicy (Fail: deny).
Expressions are compiled with `request`, `object`, `oldObject` and `variables` as dynamic
values, as unstructured objects are: `has()` is key presence, `==` is structural. Anything of
the policy this script does not model (selectors, params, messageExpression, auditAnnotations)
makes it exit with an error instead of answering wrongly.
"""

import json
import re
import sys

from cel_expr_python import cel

UNSUPPORTED_SPEC = ("paramKind", "auditAnnotations")
UNSUPPORTED_MATCH = ("namespaceSelector", "objectSelector", "excludeResourceRules")


class PolicyNotModelled(Exception):
    """The policy uses a feature this evaluator does not implement."""


def new_env():
    dyn = cel.Type.DYN
    return cel.NewEnv(variables={"request": dyn, "object": dyn, "oldObject": dyn, "variables": dyn})


def compile_all(env, named, what):
    compiled = []
    for item in named:
        expression = item["expression"]
        try:
            compiled.append((item, env.compile(expression)))
        except Exception as e:  # the API server would reject the policy: say which expression
            raise PolicyNotModelled(f"{what} {item.get('name', expression)!r} does not compile: {e}") from e
    return compiled


def evaluate(expr, data):
    """(value, None) or (None, error text)."""
    try:
        result = expr.eval(data=data)
    except Exception as e:
        return None, str(e)
    if result.type() == cel.Type.ERROR:
        return None, str(result.value())
    return result.plain_value(), None


def rule_matches(rule, request):
    def listed(values, value):
        return "*" in values or value in values

    resource = request["resource"]
    if not listed(rule.get("apiGroups", []), resource.get("group", "")):
        return False
    if not listed(rule.get("apiVersions", []), resource.get("version", "")):
        return False
    if not listed(rule.get("operations", []), request["operation"]):
        return False
    sub = request.get("subResource") or ""
    for r in rule.get("resources", []):
        name, _, rsub = r.partition("/")
        if name not in ("*", resource["resource"]):
            continue
        # "pods" selects the pod itself only; "pods/*" every subresource; "*/status" a named one.
        if (not rsub and not sub) or rsub == "*" or (rsub and rsub == sub):
            return True
    return False


def decide(policy, case):
    if policy is None:
        return {"matched": False, "allowed": True, "messages": []}
    spec = policy["spec"]
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    request = case["request"]
    constraints = spec.get("matchConstraints", {})
    if not any(rule_matches(rule, request) for rule in constraints.get("resourceRules", [])):
        return {"matched": False, "allowed": True, "messages": []}

    env = new_env()
    data = {"request": request, "object": case.get("object"), "oldObject": case.get("oldObject")}

    errors = []
    for item, expr in compile_all(env, spec.get("matchConditions", []), "matchCondition"):
        value, error = evaluate(expr, {**data, "variables": {}})
        if error is not None:
            errors.append(f"matchCondition {item['name']!r} failed: {error}")
        elif value is False:
            return {"matched": False, "allowed": True, "messages": []}
        elif value is not True:
            errors.append(f"matchCondition {item['name']!r} is not a bool: {value!r}")
    if errors:
        return {"matched": True, "allowed": not fail_closed, "messages": errors}

    variables, variable_errors = {}, {}
    for item, expr in compile_all(env, spec.get("variables", []), "variable"):
        value, error = evaluate(expr, {**data, "variables": variables})
        if error is None:
            variables[item["name"]] = value
        else:
            variable_errors[item["name"]] = error

    messages = []
    for item, expr in compile_all(env, spec.get("validations", []), "validation"):
        if "messageExpression" in item:
            raise PolicyNotModelled("messageExpression is not modelled")
        message = item.get("message") or f"failed expression: {item['expression']}"
        broken = [n for n in re.findall(r"variables\.(\w+)", item["expression"]) if n in variable_errors]
        if broken:
            value, error = None, f"variable {broken[0]!r}: {variable_errors[broken[0]]}"
        else:
            value, error = evaluate(expr, {**data, "variables": variables})
        if error is not None:
            if fail_closed:
                messages.append(f"{message} (expression error: {error})")
        elif value is not True:
            messages.append(message)
    return {"matched": True, "allowed": not messages, "messages": messages}


def check_modelled(policy):
    if policy is None:
        return
    spec = policy.get("spec", {})
    for key in UNSUPPORTED_SPEC:
        if key in spec:
            raise PolicyNotModelled(f"spec.{key} is not modelled")
    for key in UNSUPPORTED_MATCH:
        if key in spec.get("matchConstraints", {}):
            raise PolicyNotModelled(f"spec.matchConstraints.{key} is not modelled")


def main():
    try:
        query = json.load(sys.stdin)
        policy = query["policy"]
        check_modelled(policy)
        answers = [{"name": case["name"], **decide(policy, case)} for case in query["cases"]]
    except (PolicyNotModelled, KeyError, ValueError) as e:
        print(f"vap_eval: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    json.dump(answers, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
