"""Built-in scores (gsm8k strict/flexible, MATH normalisation), the data_source registry, custom function loading."""

from __future__ import annotations

import pickle

import pytest

from verlx.config.run import CustomRewardFunctionConfig
from verlx.reward.loading import FileRewardFunction, load_reward_function
from verlx.reward.scores import SCORE_FUNCTIONS, default_compute_score
from verlx.reward.scores.gsm8k import compute_score as gsm8k_score
from verlx.reward.scores.gsm8k import extract_solution
from verlx.reward.scores.math import compute_score as math_score
from verlx.reward.scores.math import is_equiv, last_boxed_content, normalize_answer


# ---------------------------------------------------------------------- gsm8k
@pytest.mark.parametrize(
    "text, truth, expected",
    [
        ("so she has 18 eggs.\n#### 18", "18", 1.0),
        ("#### 18.0", "18", 1.0),
        ("#### 18.00", "18.0", 1.0),
        ("#### $1,600", "1600", 1.0),
        ("#### -3", "-3", 1.0),
        ("#### 17", "18", 0.0),  # wrong number, format_score 0.0 by default
        ("the answer is 18", "18", 0.0),  # strict needs "#### "
        ("#### 5 first, then corrected: #### 18", "18", 1.0),  # the last marker counts
        ("####18", "18", 0.0),  # the marker is "#### " with its space
    ],
)
def test_gsm8k_strict(text, truth, expected):
    assert gsm8k_score(text, truth) == expected


def test_gsm8k_flexible_takes_the_last_number():
    assert gsm8k_score("3 apples and 15 pears make 18.", "18", method="flexible") == 1.0
    assert gsm8k_score("she had 18, then ate 2", "18", method="flexible") == 0.0
    assert gsm8k_score("10-8", "8", method="flexible") == 1.0  # a binary minus is not a sign
    assert gsm8k_score("it is -8", "-8", method="flexible") == 1.0
    assert gsm8k_score("no digits here", "18", method="flexible") == 0.0


def test_gsm8k_format_score_and_score():
    # a number was read but is wrong → format_score; none read → 0.0 regardless
    assert gsm8k_score("#### 17", "18", format_score=0.1) == 0.1
    assert gsm8k_score("no answer", "18", format_score=0.1) == 0.0
    assert gsm8k_score("#### 18", "18", format_score=0.1, score=2.0) == 2.0


def test_gsm8k_tail_window_does_not_cut_answers():
    # The marker sits exactly across the 300-character window edge: "#### 18" + 296 characters after it.
    text = "#### 1234567" + "x" * 295
    assert len(text) - text.index("#### ") > 300
    assert gsm8k_score(text, "1234567") == 1.0
    # A long number ending inside the window, starting before it (flexible).
    text = "9" * 400 + " and that is all" + " " * 10
    assert extract_solution(text, "flexible") == "9" * 400
    # Only the last 300 characters are searched otherwise: an early answer followed by a long tail is ignored.
    assert extract_solution("#### 5" + "x" * 400, "strict") is None


def test_gsm8k_large_numbers_compare_exactly():
    assert gsm8k_score("#### 123456789012345678", "123456789012345679") == 0.0
    assert gsm8k_score("#### 123456789012345679", "123,456,789,012,345,679") == 1.0


def test_gsm8k_unknown_method():
    with pytest.raises(ValueError, match="method must be one of"):
        gsm8k_score("#### 1", "1", method="fuzzy")


# ---------------------------------------------------------------------- MATH
@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("\\frac12", "\\frac{1}{2}"),
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("5 \\text{ cm}", "5"),
        ("x = 5", "5"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("\\frac{\\sqrt3}2", "\\frac{\\sqrt{3}}{2}"),
        (".5", "0.5"),
        ("90^\\circ", "90"),
        ("10\\%", "10"),
        ("\\$4.50", "4.50"),
        ("\\text{(C)}", "(C)"),
        ("3/4", "\\frac{3}{4}"),
        ("10\\,000", "10000"),
    ],
)
def test_math_normalisation(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_math_equivalences():
    assert is_equiv("0.5", "\\frac{1}{2}")
    assert is_equiv("\\frac{2}{4}", "1/2")
    assert is_equiv("-\\frac{1}{2}", "-0.5")
    assert is_equiv("18.0", "18")
    assert is_equiv("1,000", "1000")
    assert not is_equiv("\\frac{1}{3}", "0.33")
    assert not is_equiv("\\sqrt{2}", "\\sqrt{3}")
    assert not is_equiv(None, "1")


def test_math_boxed_extraction():
    assert last_boxed_content("first \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed_content("\\boxed{x^{2}+\\{1\\}}") == "x^{2}+\\{1\\}"
    assert last_boxed_content("so \\fbox{7}.") == "7"
    assert last_boxed_content("$\\boxed 5$ done") == "5"
    assert last_boxed_content("\\boxed{unclosed") is None
    assert last_boxed_content("no box") is None


def test_math_compute_score():
    assert math_score("We get $\\boxed{\\dfrac12}$.", "\\frac{1}{2}") == 1.0
    assert math_score("We get $\\boxed{0.5}$.", "\\frac{1}{2}") == 1.0
    assert math_score("We get $\\boxed{\\frac{1}{3}}$.", "\\frac{1}{2}") == 0.0
    assert math_score("The answer is 1/2", "\\frac{1}{2}") == 0.0  # no box, no score
    assert math_score("\\boxed{4}", "The area is $\\boxed{4}$") == 1.0  # a boxed reference is unboxed


# ---------------------------------------------------------------------- registry
def test_registry_routes_by_data_source():
    assert set(SCORE_FUNCTIONS.names()) == {
        "openai/gsm8k",
        "arithmetic",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
        "hiyouga/geometry3k",
    }
    assert default_compute_score("openai/gsm8k", "#### 18.0", "18") == 1.0
    assert default_compute_score("arithmetic", " #### 167", "167") == 1.0
    assert default_compute_score("arithmetic", "167", "167") == 0.0  # strict: needs "#### "
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert default_compute_score(source, "\\boxed{\\frac12}", "0.5") == 1.0


@pytest.mark.parametrize("response, truth, score", [
    ("<think>angles add up</think> so x = \\boxed{3}", "3", 1.0),      # right, in the format
    ("x = \\boxed{3}", "3", 0.9),                                      # right, no <think> block
    ("<think>a</think>\\boxed{\\frac{1}{2}}", "0.5", 1.0),             # MATH normalisation of the answer
    ("<think>a</think>\\boxed{4}", "3", 0.1),                          # wrong, in the format
    ("the answer is 3", "3", 0.0),                                      # no box: neither
])
def test_geo3k_score_weighs_accuracy_and_format(response, truth, score):
    assert default_compute_score("hiyouga/geometry3k", response, truth) == pytest.approx(score)


def test_unknown_data_source_points_to_custom_reward_function():
    with pytest.raises(KeyError) as e:
        default_compute_score("openai/gsm8kk", "#### 1", "1")
    message = str(e.value)
    assert "openai/gsm8kk" in message and "Did you mean 'openai/gsm8k'" in message
    assert "custom_reward_function.path" in message and "HuggingFaceH4/MATH-500" in message


def test_missing_ground_truth_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no ground truth"):
        default_compute_score("openai/gsm8k", "#### 1", None)


# ---------------------------------------------------------------------- custom functions from files
def test_load_reward_function_from_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def helper():\n    pass\n\n"
        "class Scorer:\n    pass\n\n"
        "def length_reward(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
        "    return scale * len(solution_str)\n"
    )
    fn = load_reward_function(
        CustomRewardFunctionConfig(path=str(path), name="length_reward", reward_kwargs={"scale": 0.5})
    )
    assert fn(data_source="x", solution_str="abcd", ground_truth=None, extra_info=None) == 2.0
    clone = pickle.loads(pickle.dumps(fn))  # pickles by file reference: how scoring workers get it
    assert isinstance(clone, FileRewardFunction) and clone("x", "abcdef", None) == 3.0
    assert load_reward_function(CustomRewardFunctionConfig()) is default_compute_score

    with pytest.raises(AttributeError) as e:
        load_reward_function(CustomRewardFunctionConfig(path=str(path), name="compute_score"))
    assert "custom_reward_function.name=compute_score" in str(e.value)
    assert "callables defined there: Scorer, helper, length_reward" in str(e.value)


def test_load_reward_function_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="custom_reward_function.path=.*missing.py does not exist"):
        load_reward_function(CustomRewardFunctionConfig(path=str(tmp_path / "missing.py")))
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(
        ImportError, match="importing custom_reward_function.path=.*broken.py failed: ModuleNotFoundError"
    ):
        load_reward_function(CustomRewardFunctionConfig(path=str(broken)))
    narrow = tmp_path / "narrow.py"
    narrow.write_text("def compute_score(solution_str, ground_truth):\n    return 1.0\n")
    with pytest.raises(TypeError, match="cannot be called as compute_score\\(data_source, solution_str"):
        load_reward_function(CustomRewardFunctionConfig(path=str(narrow)))
    with pytest.raises(ValueError, match="reward_kwargs is set but custom_reward_function.path is null"):
        load_reward_function(CustomRewardFunctionConfig(reward_kwargs={"a": 1}))
