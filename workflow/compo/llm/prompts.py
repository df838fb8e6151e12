"""Prompts of the LLM negative generators, verbatim from the seeds.

DeGLA (seed 000, Figure 8, the LLaMA3.1-8B-instruct column): one prompt per rewrite type with five few-shot
examples, the prompt's placeholders <example1>..<example5>. The seed draws them from 50 ChatGPT examples per type
it selected by hand (sec. 3.2), which are not released; Figure 9 prints two per type, shipped here first, and the
other three are ours, written in Figure 9's style to the type's rule (Table 1 / sec. 3.2): a reshuffle reorders
the same words, a swap exchanges two nouns or two adjectives, a replacement changes only nouns or adjectives
(tests/test_degla_prompts.py checks each of ours with spaCy).
ConcretePlant (seed 002, appendix A.2): the task/instruction prompt with per-category in-context
examples (attribute, relation, object; "without considering concreteness" for the wo policy).
"""

from __future__ import annotations

DEGLA_RULES: dict[str, str] = {
    "reshuffle": "Reshuffle the overall order of the sentence",
    "noun_swap": "Swap the nouns in the sentence",
    "adjective_swap": "Swap the adjectives in the sentence",
    "adjective_replace": "Replace the adjectives in the sentence",
    "noun_replace": "Replace the nouns in the sentence",
}

DEGLA_EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "reshuffle": [
        ("The sun rises over the mountains, casting a golden glow.",
         "Over a sun casting glow. rises The the golden mountains."),
        ("A squirrel darted across the park, searching for acorns.",
         "Searching for across A acorns. darted squirrel the park."),
        ("A child feeds the ducks at the pond, laughing with joy.",
         "With the ducks laughing at joy. feeds A pond the child."),
        ("The old fisherman mends his net beside the quiet harbor.",
         "Beside his net the fisherman mends. old quiet The harbor."),
        ("A girl paints flowers on the garden wall in the morning.",
         "In the wall girl paints morning. A flowers on the garden."),
    ],
    "adjective_replace": [
        ("The fluffy white cat sat on the soft blue cushion.", "The matted gray cat sat on the hard red cushion."),
        ("A reliable electric car passed the broken gasoline truck.",
         "A faulty diesel car trailed the reliable hybrid truck."),
        ("A bright red kite flies over the green field.", "A dull blue kite flies over the brown field."),
        ("The young man carries a heavy wooden box.", "The old man carries a light plastic box."),
        ("A clean white plate sits on the round table.", "A dirty black plate sits on the square table."),
    ],
    "adjective_swap": [
        ("The fluffy white cat chased the sleek black dog.", "The sleek white cat chased the fluffy black dog."),
        ("Her smooth silk dress touched the rough wool sweater.",
         "Her rough silk dress touched the smooth wool sweater."),
        ("A tall woman stands beside a short man.", "A short woman stands beside a tall man."),
        ("The hot soup sat beside the cold salad.", "The cold soup sat beside the hot salad."),
        ("The wet towel hangs over the dry chair.", "The dry towel hangs over the wet chair."),
    ],
    "noun_swap": [
        ("The cat chased the dog around the garden.", "The dog chased the cat around the garden."),
        ("A student borrowed a book from the library.", "A book borrowed a student from the library."),
        ("The chef handed the waiter a plate of pasta.", "The waiter handed the chef a plate of pasta."),
        ("A horse pulls the cart along the dirt road.", "A cart pulls the horse along the dirt road."),
        ("The boy is walking the dog on the beach.", "The dog is walking the boy on the beach."),
    ],
    "noun_replace": [
        ("The dog uncovered the bone in the yard.", "The cat uncovered the bone in the yard."),
        ("The rain canceled the outdoor concert.", "The wind canceled the outdoor concert."),
        ("A woman rides a bicycle through the park.", "A woman rides a horse through the park."),
        ("The boy throws a ball to his dog.", "The boy throws a stick to his cat."),
        ("A man reads a newspaper on the train.", "A man reads a menu on the bus."),
    ],
}

FIGURE_9_EXAMPLES = 2  # the first examples of each type are the seed's Figure 9; the rest are ours

DEGLA_TEMPLATE = (
    "Please rewrite the following input caption based on the rewrite rule and examples: <{rule}>. "
    "Here are the examples: {examples}. ensuring that the rewritten sentences have significantly different "
    "or opposite meanings from the original sentences. Input text: {caption}"
)


def degla_prompt(caption: str, rewrite_type: str) -> str:
    """DeGLA's Figure 8 prompt for one rewrite type, with its five examples (Figure 9's two, then ours)."""
    if rewrite_type not in DEGLA_RULES:
        raise ValueError(f"DeGLA rewrite type {rewrite_type!r}: unknown (known: {', '.join(DEGLA_RULES)})")
    examples = ",".join(f"<{original} -> {rewritten}>" for original, rewritten in DEGLA_EXAMPLES[rewrite_type])
    return DEGLA_TEMPLATE.format(rule=DEGLA_RULES[rewrite_type], examples=examples, caption=caption)


CONCRETEPLANT_TEMPLATE = (
    "**Task**: You are an expert data engineer. Given a conceptual caption, your goal is to generate a new "
    "caption that is physically and grammatically correct but factually mismatched to the original image. "
    "**Instruction**: 1. You will be provided with an original caption and a target keyword present in the "
    "caption. 2. Locate the keyword within the caption and replace it with a new word or phrase that creates "
    "a clear visual conflict. 3. Keep the sentence structure, grammar, and all other words identical to the "
    "original. 4. The output must be physically sensible (e.g., \"A hat wearing a man\" is NOT allowed). "
    "5. ONLY output the new caption, do not include reasons for the output. **Examples**: {examples} "
    "Input: {caption} Keyword: {keyword} Output:"
)

CONCRETEPLANT_EXAMPLES: dict[str, list[tuple[str, str, str]]] = {
    "attribute": [
        ("A person wearing a red helmet", "red", "A person wearing a blue helmet."),
        ("A wooden boat floating on the water", "wooden", "A plastic boat floating on the water."),
        ("The cloudy sky over the city", "cloudy", "The clear sky over the city."),
    ],
    "relation": [
        ("A cat sitting under a table", "under", "A cat sitting on a table."),
        ("A child standing in front of the tree", "front", "A child standing behind the tree."),
        ("A lamp placed to the left of the sofa", "left", "A lamp placed to the right of the sofa."),
    ],
    "object": [
        ("A dog running in the park", "dog", "A cat running in the park."),
        ("A woman holding a coffee cup", "coffee cup", "A woman holding a laptop."),
        ("A car driving on the highway", "highway", "A car driving on the grass."),
    ],
    "wo": [
        ("A person wearing a red helmet", "red", "A person wearing a blue helmet."),
        ("A child standing in front of the tree", "front", "A child standing behind the tree."),
        ("A car driving on the highway", "highway", "A car driving on the grass."),
    ],
}


def concreteplant_prompt(caption: str, keyword: str, category: str, policy: str) -> str:
    """Seed 002's A.2 prompt; the wo policy uses the 'without considering concreteness' examples."""
    key = "wo" if policy == "wo" else category
    if key not in CONCRETEPLANT_EXAMPLES:
        raise ValueError(f"ConcretePlant category {category!r}: unknown (known: attribute, relation, object)")
    examples = " ".join(f"Input: {c}, Keyword: {k}, Output: {o}" for c, k, o in CONCRETEPLANT_EXAMPLES[key])
    return CONCRETEPLANT_TEMPLATE.format(examples=examples, caption=caption, keyword=keyword)
