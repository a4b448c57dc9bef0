"""Chat prompts for a real chat verifier (e.g. SmolLM2-135M-Instruct): unscored, used to distil a
drafter on the verifier's own answers (`training_prompts`) and to measure speed on prompts the drafter
never saw (`HELDOUT`).

Training prompts are made from instruction templates and subjects: one subject (`_TEMPLATES`), one subject
for an audience (`_AUDIENCE_TEMPLATES` x `_AUDIENCES`) and two subjects (`_PAIR_TEMPLATES`, a fixed sample of the
pairs). No held-out prompt is among them (tests/tasks/test_tasks_chat.py checks it), no held-out subject is a training
subject, and subjects that sit near a held-out prompt's topic (`NEAR_HELDOUT`: bees, storms, the sky's light, ...)
are left out. The shipped smollm2-drafter was distilled on the first pool (32 templates x 279 subjects, 8928
prompts; git history before this pool); this one has 10x as many, for its retraining.
"""

from __future__ import annotations

import functools
import random

HELDOUT = [
    "What is the capital of France, and what is it famous for?",
    "Explain how a rainbow forms.",
    "Write a short poem about the ocean at night.",
    "Give three tips for staying focused while studying.",
    "What is the difference between weather and climate?",
    "How does a refrigerator keep food cold?",
    "Describe the water cycle in simple terms.",
    "Why do leaves change color in autumn?",
    "Write a friendly email inviting a colleague to lunch.",
    "What are the main benefits of regular exercise?",
    "Explain what a computer virus is.",
    "How do bees make honey?",
    "Summarize the story of Cinderella in a few sentences.",
    "What should I pack for a weekend camping trip?",
    "Explain why the sky is blue.",
    "What is photosynthesis?",
    "Give me a simple recipe for pancakes.",
    "How can I save money on groceries?",
    "What causes earthquakes?",
    "Describe a typical day in the life of a firefighter.",
]

_TEMPLATES = [
    "Explain {s} to a ten-year-old.",
    "What is {s}?",
    "Give three interesting facts about {s}.",
    "Write a short paragraph about {s}.",
    "What are the advantages and disadvantages of {s}?",
    "How would you describe {s} to someone who has never heard of it?",
    "Write a haiku about {s}.",
    "Why is {s} important?",
    "List five questions a student might ask about {s}, with short answers.",
    "Summarize the history of {s} in a few sentences.",
    "Give me some tips related to {s}.",
    "Write a short story that involves {s}.",
    "What is {s}, and why does it matter?",
    "Explain how {s} works.",
    "Write a short poem about {s}.",
    "Give three tips for someone interested in {s}.",
    "How does {s} affect our daily lives?",
    "Describe {s} in simple terms.",
    "Write a friendly note to a friend about {s}.",
    "What are the main benefits of {s}?",
    "What should a beginner know about {s}?",
    "Describe a typical day for someone who works with {s}.",
    "What are common misconceptions about {s}?",
    "Write a short dialogue between two people discussing {s}.",
    "Explain {s} in one paragraph.",
    "Give me a fun fact about {s}.",
    "Compare {s} with something from everyday life.",
    "How has {s} changed over time?",
    "Write a limerick about {s}.",
    "What would the world be like without {s}?",
    "Teach me the basics of {s} step by step.",
    "What questions do scientists still have about {s}?",
    "Write a tweet about {s}.",
    "Write a short FAQ with three questions and answers about {s}.",
    "Make an outline for a five-minute talk on {s}.",
    "Explain {s} using an analogy.",
    "Write a product description for a gift inspired by {s}.",
    "Describe {s} in exactly three sentences.",
    "What jobs are connected to {s}?",
    "Write a riddle whose answer is {s}.",
    "Tell me a gentle joke about {s}.",
    "Give five words that describe {s}, and explain each one.",
    "Write a news headline and a short article about {s}.",
    "What would a museum exhibit about {s} show?",
    "Write a short speech celebrating {s}.",
    "What are the first steps to learn about {s}?",
    "Give an example of {s} in everyday life.",
    "What are the risks associated with {s}?",
    "Create a short quiz about {s}, with the answers.",
    "Write a diary entry from someone who loves {s}.",
    "What is the future of {s}?",
    "Describe {s} from the point of view of a curious alien.",
    "Write an encouraging message that mentions {s}.",
    "Why do some people dislike {s}?",
    "List the key terms someone should know about {s}, with a definition for each.",
    "Write a short review of an imaginary book about {s}.",
    "How do different cultures view {s}?",
    "What is the most surprising thing about {s}?",
    "Describe {s} in the style of a sports commentator.",
    "Write a letter to a newspaper about {s}.",
    "What would you ask an expert on {s}?",
    "Summarize what {s} is in a single sentence.",
    "Write a short song about {s}.",
    "What are three things most people get wrong about {s}?",
]

# One subject, for an audience: each template with each audience.
_AUDIENCE_TEMPLATES = [
    "Explain {s} to {a}.",
    "How would you teach {s} to {a}?",
    "Write a short talk about {s} for {a}.",
    "What would {a} want to know about {s}?",
]
_AUDIENCES = [
    "a five-year-old", "a teenager", "a grandparent", "a new employee", "a tourist", "a scientist",
    "a skeptical friend", "someone learning English",
]

# Two subjects: a fixed sample of (template, pair) (`_PAIRS` of them, the pair's order as in `_SUBJECTS`).
_PAIR_TEMPLATES = [
    "Compare {s} and {t}.",
    "What do {s} and {t} have in common?",
    "Write a short story that involves {s} and {t}.",
    "How are {s} and {t} connected?",
    "Which is more interesting, {s} or {t}? Explain why.",
    "Write a short dialogue between an expert on {s} and an expert on {t}.",
]
_PAIRS = 48_000


# Subjects of the training prompts; none is a subject of a held-out prompt (those near one: NEAR_HELDOUT, below).
_SUBJECTS = [
    "volcanoes", "the moon", "electricity", "gravity", "the human heart", "recycling", "the internet",
    "solar panels", "dinosaurs", "the Roman Empire", "chess", "coffee", "the piano", "penguins",
    "the stock market", "vaccines", "black holes", "the printing press", "bicycles", "yoga",
    "the Amazon rainforest", "glaciers", "democracy", "music theory", "the immune system", "tea",
    "electric cars", "the Great Wall of China", "mathematics", "friendship", "public libraries",
    "sleep", "the Olympic Games", "airplanes", "sharks", "deserts", "cloud computing", "robots",
    "the Renaissance", "gardening", "time management", "bread baking", "the solar system",
    "cats", "dogs", "earth's atmosphere", "trains", "bridges", "photography", "wind energy",
    "ancient Egypt", "mountains", "coral reefs", "social media", "chocolate", "the violin",
    "the printing of books", "magnets", "spiders", "rivers", "the French Revolution", "soccer",
    "meditation", "learning a language", "kindness", "museums", "pizza", "the periodic table",
    "elephants", "snow", "lighthouses", "smartphones", "the brain", "owls", "video games",
    "classical music", "origami", "the desert tortoise", "submarines", "hot air balloons",
    "the Moon landing", "knitting", "jazz", "the Pyramids of Giza", "octopuses", "tigers", "whales",
    "dolphins", "horses", "butterflies", "ants", "frogs", "eagles", "parrots", "wolves", "bats",
    "mushrooms", "cactus plants", "oak trees", "sunflowers", "tomatoes", "rice", "cheese", "ice cream",
    "sushi", "olive oil", "spices", "vegetarian cooking", "table manners", "birthdays", "weddings",
    "board games", "puzzles", "magic tricks", "circuses", "theaters", "movies", "cartoons", "comic books",
    "poetry", "novels", "fairy tales", "myths of ancient Greece", "the Vikings", "the Maya civilization",
    "the Industrial Revolution", "the Silk Road", "medieval castles", "knights", "pirates", "explorers",
    "maps", "compasses", "clocks", "calendars", "the alphabet", "writing systems", "handwriting",
    "public speaking", "job interviews", "teamwork", "leadership", "negotiation", "habits", "motivation",
    "creativity", "curiosity", "patience", "honesty", "gratitude", "happiness", "stress", "laughter",
    "dreams", "memory", "the five senses", "the human skeleton", "muscles", "the lungs", "the liver",
    "blood", "DNA", "genetics", "evolution", "fossils", "cells", "bacteria", "microscopes", "telescopes",
    "satellites", "rockets", "the International Space Station", "Mars", "Jupiter", "Saturn's rings",
    "comets", "stars", "galaxies", "the Big Bang", "light", "sound", "heat", "friction", "energy",
    "batteries", "nuclear power", "hydroelectric dams", "oil and gas", "plastic", "glass", "steel",
    "concrete", "wood", "paper", "cotton", "silk", "wool", "skyscrapers", "tunnels", "roads",
    "traffic lights", "cars", "motorcycles", "ships", "canals", "harbors", "airports", "helicopters",
    "drones", "3D printing", "artificial intelligence", "programming", "databases", "passwords",
    "encryption", "email spam", "search engines", "web browsers", "open source software", "spreadsheets",
    "keyboards", "television", "radio", "the telephone", "newspapers", "advertising", "banks",
    "credit cards", "taxes", "insurance", "small businesses", "farming", "fishing", "beekeeping",
    "forests", "islands", "caves", "waterfalls", "lakes", "swamps", "the Arctic", "Antarctica",
    "tornadoes", "hurricanes", "lightning", "tides", "sand dunes", "rocks and minerals", "diamonds",
    "gold", "volunteering", "neighborhoods", "city parks", "zoos", "aquariums", "hospitals", "nurses",
    "teachers", "pilots", "chefs", "architects", "farmers", "astronauts", "detectives", "librarians",
    "basketball", "tennis", "swimming", "running marathons", "cycling races", "skiing", "surfing",
    "rock climbing", "martial arts", "dance", "painting", "sculpture", "pottery", "calligraphy",
    # added with the wider pool
    "giraffes", "kangaroos", "koalas", "pandas", "camels", "hedgehogs", "squirrels", "raccoons", "beavers", "otters",
    "foxes", "bears", "lions", "zebras", "gorillas", "crows", "hummingbirds", "flamingos", "snakes", "chameleons",
    "snails", "earthworms", "ladybugs", "dragonflies", "fireflies", "jellyfish", "sea turtles", "hibernation",
    "animal migration", "camouflage", "bamboo", "cherry blossoms", "potatoes", "apples", "bananas", "lemons",
    "strawberries", "coconuts", "garlic", "noodles", "tacos", "curry", "dumplings", "sandwiches", "yogurt", "popcorn",
    "fermentation", "street food", "food trucks", "farmers' markets", "vitamins", "the digestive system",
    "the human eye", "hearing", "allergies", "first aid", "the placebo effect", "sign language", "acids and bases",
    "electric circuits", "lasers", "x-rays", "virtual reality", "smartwatches", "QR codes", "GPS", "Wi-Fi",
    "barcodes", "electric scooters", "self-driving cars", "computer chips", "operating systems", "podcasts",
    "online courses", "video calls", "digital cameras", "e-books", "typewriters", "the abacus", "calculators",
    "elevators", "escalators", "vending machines", "light bulbs", "sewing machines", "locks and keys", "the Aztecs",
    "the Incas", "ancient China", "the Ottoman Empire", "samurai", "the Wild West", "the Gold Rush", "the Titanic",
    "the Statue of Liberty", "Stonehenge", "the Colosseum", "Machu Picchu", "the Taj Mahal", "Venice", "Tokyo",
    "the Nile", "the Sahara", "the Himalayas", "Mount Everest", "the Grand Canyon", "Iceland", "the Alps",
    "hot springs", "geysers", "moving to a new city", "learning to drive", "first jobs", "holiday traditions",
    "family dinners", "houseplants", "bird watching", "stargazing", "road trips", "train journeys", "bookshops",
    "reading aloud", "journaling", "opera", "ballet", "hip hop", "the guitar", "drums", "the flute", "choirs",
    "street art", "mosaics", "stained glass", "animation", "puppets", "stand-up comedy", "folk songs", "lullabies",
    "crossword puzzles", "riddles", "card games", "kites", "model trains", "Lego bricks", "skateboarding", "bowling",
    "golf", "baseball", "cricket", "volleyball", "table tennis", "badminton", "fencing", "archery", "sailing",
    "kayaking", "horse riding", "ice skating", "gymnastics", "elections", "courts and judges", "the United Nations",
    "human rights", "charities", "public transport", "bicycle lanes", "city planning", "postal services", "doctors",
    "dentists", "veterinarians", "mechanics", "plumbers", "electricians", "carpenters", "tailors", "journalists",
    "translators", "engineers", "musicians", "zookeepers", "lifeguards", "park rangers",
]

# Left out of the pool: training subjects that sit near a held-out prompt's topic (bees and honey, weather and climate,
# the sky's colour and rainbows, earthquakes, Cinderella, pancakes, emails), so that a drafter's tau on the held-out
# prompts is not helped by answers on their topics.
NEAR_HELDOUT = ("beekeeping", "tornadoes", "hurricanes", "lightning", "earth's atmosphere", "light", "volcanoes",
                "fairy tales", "bread baking", "email spam")
_SUBJECTS = [s for s in _SUBJECTS if s not in NEAR_HELDOUT]


@functools.cache
def _pool() -> tuple[str, ...]:
    """Every training prompt, in a fixed order: one subject, one subject for an audience, then the sample of pairs."""
    pool = [t.format(s=s) for s in _SUBJECTS for t in _TEMPLATES]
    pool += [t.format(s=s, a=a) for s in _SUBJECTS for t in _AUDIENCE_TEMPLATES for a in _AUDIENCES]
    S, T = len(_SUBJECTS), len(_PAIR_TEMPLATES)
    pairs = [(i, j) for i in range(S) for j in range(i + 1, S)]
    for k in random.Random(0).sample(range(T * len(pairs)), _PAIRS):
        i, j = pairs[k // T]
        pool.append(_PAIR_TEMPLATES[k % T].format(s=_SUBJECTS[i], t=_SUBJECTS[j]))
    return tuple(pool)


def pool_size() -> int:
    """How many distinct training prompts there are (`training_prompts` gives at most that many)."""
    return len(_pool())


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """n distinct training prompts, shuffled with `seed` (one subject, one for an audience, or two subjects); at
    most `pool_size()` of them."""
    pool = list(_pool())
    if not 0 < n <= len(pool):
        raise ValueError(f"chat training prompts: n must be in 1..{len(pool)} (the pool's size), got {n}")
    random.Random(seed).shuffle(pool)
    return pool[:n]
