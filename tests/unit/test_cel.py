"""The DRA CEL environment: functions, error semantics, domain rules, NVIDIA selectors."""

from fractions import Fraction

import pytest

from claims.cel import (
    CelCompileError,
    CelRuntimeError,
    compile_selector,
    device_view,
    evaluate,
)
from fleet.quantity import QuantityError, parse_quantity, parse_semver

GPU = device_view(
    "gpu.nvidia.com",
    {
        "name": "gpu-0",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "driverVersion": {"version": "580.95.5"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "numa": {"int": 1},
            "iommuFDEnabled": {"bool": True},
            "resource.kubernetes.io/pciBusID": {"string": "0000:65:00.0"},
        },
        "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}},
    },
)
MIG = device_view(
    "gpu.nvidia.com",
    {
        "name": "gpu-0-mig-1g10gb-19-0",
        "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}},
        "capacity": {"memory": {"value": "9856Mi"}},
    },
)
OTHER = device_view("dra.example.com", {"name": "x", "attributes": {"model": {"string": "foo"}}})


def run(expression: str, device=GPU) -> bool:
    return evaluate(compile_selector(expression), device)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("1024Mi", 2**30),
        ("40Gi", 40 * 2**30),
        ("1Ki", 1024),
        ("1k", 1000),
        ("1M", 10**6),
        ("2G", 2 * 10**9),
        ("1T", 10**12),
        ("500m", Fraction(1, 2)),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("1.5Gi", 3 * 2**29),
        ("-2", -2),
        ("+.5", Fraction(1, 2)),
        ("0.0000000001", Fraction(1, 10**9)),  # rounded up to nano
    ],
)
def test_it_parses_kubernetes_quantities_exactly(text, value):
    assert parse_quantity(text).value == value


@pytest.mark.parametrize("text", ["", "1GB", "Gi", "1 Gi", "1.2.3", "abc"])
def test_it_rejects_malformed_quantities(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_semver_orders_prereleases_before_releases():
    assert parse_semver("1.0.0-alpha").compare(parse_semver("1.0.0")) == -1
    assert parse_semver("1.0.0-alpha.1").compare(parse_semver("1.0.0-alpha.beta")) == -1
    assert parse_semver("1.0.0+build") == parse_semver("1.0.0")
    assert str(parse_semver("v1.2", normalize=True)) == "1.2.0"


@pytest.mark.parametrize(
    "expression",
    [
        # quantity library
        "quantity('1Gi') == quantity('1024Mi')",
        "quantity('1Gi').compareTo(quantity('1024Mi')) == 0",
        "quantity('2Gi').isGreaterThan(quantity('1Gi'))",
        "quantity('1Gi').isLessThan(quantity('2Gi'))",
        "quantity('1Gi').add(quantity('1Gi')) == quantity('2Gi')",
        "quantity('1Gi').add(1) == quantity('1073741825')",
        "quantity('1Gi').sub(quantity('512Mi')) == quantity('512Mi')",
        "quantity('1Gi').sub(1).asInteger() == 1073741823",
        "quantity('1Gi').asInteger() == 1073741824",
        "quantity('1k').isInteger() && !quantity('500m').isInteger()",
        "quantity('-5').sign() == -1 && quantity('0').sign() == 0 && quantity('3').sign() == 1",
        "quantity('500m').asApproximateFloat() == 0.5",
        "isQuantity('1Gi') && !isQuantity('1GB')",
        # semver library
        "semver('1.2.3').major() == 1 && semver('1.2.3').minor() == 2 && semver('1.2.3').patch() == 3",
        "semver('1.2.3').compareTo(semver('1.2.4')) == -1",
        "semver('1.10.0').isGreaterThan(semver('1.9.0'))",
        "semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))",
        "semver('v1.2', true) == semver('1.2.0')",
        "isSemver('1.2.3') && !isSemver('1.2') && isSemver('1.2', true)",
        # strings
        "'ABC'.lowerAscii() == 'abc' && 'abc'.upperAscii() == 'ABC'",
        "'a,b,c'.split(',') == ['a', 'b', 'c'] && 'a,b,c'.split(',', 2) == ['a', 'b,c']",
        "['a', 'b'].join('-') == 'a-b' && ['a', 'b'].join() == 'ab'",
        "'hello'.indexOf('l') == 2 && 'hello'.lastIndexOf('l') == 3 && 'hello'.indexOf('z') == -1",
        "'hello'.replace('l', 'L') == 'heLLo' && 'hello'.replace('l', 'L', 1) == 'heLlo'",
        "'  x '.trim() == 'x'",
        "'hello'.substring(1) == 'ello' && 'hello'.substring(1, 3) == 'el'",
        "'hello'.charAt(1) == 'e'",
        "'NVIDIA H100'.matches('^NVIDIA H1[0-9]0') && matches('abc', 'b')",
        "'NVIDIA H100'.startsWith('NVIDIA') && 'NVIDIA H100'.endsWith('H100') && 'abc'.contains('b')",
        "'abc'.size() == 3 && size('abc') == 3",
        "'abc123'.find('[0-9]+') == '123' && 'a1b2'.findAll('[0-9]') == ['1', '2']",
        # lists library
        "[1, 2, 3].isSorted() && ![2, 1].isSorted()",
        "[1, 2, 3].sum() == 6 && [3, 1, 2].min() == 1 && [3, 1, 2].max() == 3",
        "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1",
        "sets.contains([1, 2, 3], [2]) && sets.intersects([1], [1, 5]) && sets.equivalent([1, 2], [2, 1])",
        # optional types
        "optional.of(1).hasValue() && !optional.none().hasValue()",
        "optional.none().orValue(5) == 5 && optional.of(2).value() == 2",
        "optional.none().or(optional.of(3)).value() == 3",
        "{'a': 1}.?a.orValue(0) == 1 && {'a': 1}.?b.orValue(0) == 0",
        "{'a': 1}[?'b'].hasValue() == false",
        # macros, maps, logic, arithmetic
        "has({'a': 1}.a) && !has({'a': 1}.b)",
        "'a' in {'a': 1} && !('b' in {'a': 1}) && 2 in [1, 2]",
        "[1, 2, 3].all(x, x > 0) && [1, 2].exists(x, x == 2) && [1, 2].exists_one(x, x == 1)",
        "[1, 2].map(x, x * 2) == [2, 4] && [1, 2, 3].filter(x, x > 1) == [2, 3]",
        "cel.bind(x, 2, x * x) == 4",
        "1 < 1.5 && 2u > 1 && 1.0 <= 1",  # CrossTypeNumericComparisons
        "7 / 2 == 3 && -7 / 2 == -3 && 7 % 3 == 1 && 'a' + 'b' == 'ab' && [1] + [2] == [1, 2]",
        "true ? true : false",
        "int('12') == 12 && string(12) == '12' && double(1) == 1.0 && dyn(1) == 1",
    ],
)
def test_cel_library_functions(expression):
    assert run(expression) is True


def test_device_fields_and_domains():
    assert run("device.driver == 'gpu.nvidia.com'")
    assert run("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'")
    assert run("device.attributes['gpu.nvidia.com']['numa'] == 1")
    assert run("device.attributes['gpu.nvidia.com'].iommuFDEnabled")
    assert run("device.attributes['resource.kubernetes.io'].pciBusID == '0000:65:00.0'")
    assert run("!('pciBusID' in device.attributes['gpu.nvidia.com'])")
    assert run("device.capacity['gpu.nvidia.com'].memory == quantity('80Gi')")
    assert run("device.allowMultipleAllocations == false")


def test_unknown_domain_is_an_empty_map():
    assert run("!('x' in device.attributes['nope.example.com'])")
    assert run("size(device.capacity['nope.example.com']) == 0")
    assert run("!has(device.attributes['nope.example.com'].x)")


def test_version_attributes_are_semver_values():
    assert run("device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('570.0.0'))")
    assert run("device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('9.0.0')) >= 0")
    assert run("device.attributes['gpu.nvidia.com'].driverVersion.major() == 580")


def test_missing_key_is_a_runtime_error():
    with pytest.raises(CelRuntimeError) as exc:
        run("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('1'))", OTHER)
    assert exc.value.message == "no such key: memory"
    with pytest.raises(CelRuntimeError, match="no such key: noSuchAttr"):
        run("device.attributes['gpu.nvidia.com'].noSuchAttr == 1")


def test_missing_key_can_be_guarded():
    assert run("has(device.attributes['gpu.nvidia.com'].noSuchAttr) == false")
    assert run("device.attributes['gpu.nvidia.com'].?noSuchAttr.orValue('x') == 'x'")
    assert run("'noSuchAttr' in device.attributes['gpu.nvidia.com'] == false")


@pytest.mark.parametrize(
    "expression",
    [
        "device.attributes['gpu.nvidia.com'].nope == 1 && false",
        "false && device.attributes['gpu.nvidia.com'].nope == 1",
        "device.driver == 'other' && device.attributes['gpu.nvidia.com'].nope == 1",
    ],
)
def test_and_absorbs_an_error_when_the_other_side_is_false(expression):
    assert run(expression) is False


@pytest.mark.parametrize(
    "expression",
    [
        "device.attributes['gpu.nvidia.com'].nope == 1 || true",
        "true || device.attributes['gpu.nvidia.com'].nope == 1",
    ],
)
def test_or_absorbs_an_error_when_the_other_side_is_true(expression):
    assert run(expression) is True


@pytest.mark.parametrize(
    "expression",
    [
        "device.attributes['gpu.nvidia.com'].nope == 1 && true",
        "true && device.attributes['gpu.nvidia.com'].nope == 1",
        "device.attributes['gpu.nvidia.com'].nope == 1 || false",
    ],
)
def test_logic_keeps_the_error_when_the_other_side_does_not_decide(expression):
    with pytest.raises(CelRuntimeError, match="no such key: nope"):
        run(expression)


def test_ordering_on_quantities_is_a_compile_error():
    with pytest.raises(CelCompileError) as exc:
        compile_selector("device.capacity['gpu.nvidia.com'].memory >= quantity('40Gi')")
    assert exc.value.message.startswith(
        "compilation failed: ERROR: <input>:1:42: found no matching overload for '_>=_' applied to "
        "'(kubernetes.Quantity, kubernetes.Quantity)'"
    )
    assert exc.value.expression == "device.capacity['gpu.nvidia.com'].memory >= quantity('40Gi')"


def test_ordering_on_semver_is_a_compile_error_for_typed_values():
    with pytest.raises(CelCompileError, match=r"'_<_' applied to '\(kubernetes.Semver, kubernetes.Semver\)'"):
        compile_selector("semver('1.0.0') < semver('2.0.0')")


def test_ordering_two_version_attributes_fails_at_runtime():
    selector = compile_selector(
        "device.attributes['gpu.nvidia.com'].driverVersion > "
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability"
    )
    with pytest.raises(CelRuntimeError, match="no such overload"):
        evaluate(selector, GPU)


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("1 == 'a'", "found no matching overload for '_==_' applied to '(int, string)'"),
        ("quantity('1').compareTo(1) == 0", "'compareTo' applied to 'kubernetes.Quantity.(int)'"),
        ("quantity(1) == quantity('1')", "found no matching overload for 'quantity' applied to '(int)'"),
        ("device.allowMultipleAllocation", "undefined field 'allowMultipleAllocation'"),
        ("nope == 1", "undeclared reference to 'nope'"),
        ("'a'.noSuchFunction()", "undeclared reference to 'noSuchFunction'"),
        ("1 +", "Syntax error"),
        ("[1, 'a'] == []", "expected type 'int' but found 'string'"),
    ],
)
def test_type_mismatches_are_compile_errors(expression, fragment):
    with pytest.raises(CelCompileError) as exc:
        compile_selector(expression)
    assert fragment in exc.value.message


def test_non_bool_result_is_rejected():
    with pytest.raises(CelCompileError, match="must evaluate to bool or the unknown type, not int"):
        compile_selector("1 + 1")
    # attribute values are dynamic: accepted at compile time, rejected at evaluation
    with pytest.raises(CelRuntimeError):
        run("device.attributes['gpu.nvidia.com'].numa")


def test_runtime_type_mismatch_on_dynamic_values():
    with pytest.raises(CelRuntimeError, match="no such overload"):
        run("device.attributes['gpu.nvidia.com'].productName > 5")
    assert run("device.attributes['gpu.nvidia.com'].productName != 5")  # heterogeneous equality


def test_nvidia_device_class_selectors():
    gpu_class = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    mig_class = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    assert run(gpu_class, GPU) and not run(gpu_class, MIG) and not run(gpu_class, OTHER)
    assert run(mig_class, MIG) and not run(mig_class, GPU)


def test_nvidia_claim_selectors():
    memory = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
    assert run(memory, GPU) and not run(memory, MIG)
    profile = "device.attributes['gpu.nvidia.com'].profile in ['1g.10gb','2g.20gb']"
    assert run(profile, MIG)
    product = "device.attributes['gpu.nvidia.com'].productName.matches('^NVIDIA (H100|H200)')"
    assert run(product, GPU)
    lowered = "device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('h100')"
    assert run(lowered, GPU)


def test_references_name_what_the_selector_reads():
    selector = compile_selector(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && "
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0 && "
        "has(device.attributes['resource.kubernetes.io'].pciBusID)"
    )
    assert selector.references == frozenset(
        {
            ("attributes", "gpu.nvidia.com", "type"),
            ("capacity", "gpu.nvidia.com", "memory"),
            ("attributes", "resource.kubernetes.io", "pciBusID"),
        }
    )
    assert not selector.opaque
    assert selector.reads_driver


def test_whole_map_reads_are_opaque():
    assert compile_selector("size(device.attributes['gpu.nvidia.com']) > 0").opaque
    assert compile_selector("device.attributes[device.driver].type == 'gpu'").opaque


def test_compile_is_cached():
    assert compile_selector("true == true") is compile_selector("true == true")


def test_device_view_splits_qualified_names():
    view = device_view("gpu.nvidia.com", {"attributes": {"gpu.nvidia.com/x": {"int": 1}, "y": {"int": 2}}})
    assert view.attributes == {"gpu.nvidia.com": {"x": 1, "y": 2}}


def test_list_attributes_are_cel_lists_as_with_the_list_type_attributes_gate():
    view = device_view("d.example.com", {"attributes": {"numa": {"ints": [0, 1]}, "s": {"strings": ["a"]}}})
    assert evaluate(compile_selector("device.driver == 'd.example.com'"), view)
    assert evaluate(compile_selector("1 in device.attributes['d.example.com'].numa"), view)
    assert evaluate(compile_selector("device.attributes['d.example.com'].s.exists(x, x == 'a')"), view)


def test_an_attribute_without_a_value_fails_every_evaluation():
    view = device_view("d.example.com", {"attributes": {"numa": {}}})
    with pytest.raises(CelRuntimeError, match="attribute numa: unsupported attribute value"):
        evaluate(compile_selector("true"), view)


def test_bad_version_attribute_fails_evaluation():
    view = device_view("d.example.com", {"attributes": {"v": {"version": "1.2"}}})
    with pytest.raises(CelRuntimeError, match="parse semantic version"):
        evaluate(compile_selector("true"), view)
