"""A hand-written catalogue of user-state variables for the procedural generator: life domains, each
with variables whose values carry first-person renderings (how a user would reveal the value in
conversation) and one line of advice tailored to that value (used to compose personalised answers).

Renderings are written so each one reveals its own variable's value and no other variable of the
catalogue; the procedural tests check that no rendering appears inside another.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Value:
    """One choice of a variable: its data.json string, first-person renderings and tailored advice."""

    name: str
    renderings: tuple[str, ...]
    advice: str

    @property
    def label(self) -> str:
        """The value as words, e.g. 'public transit' for 'public_transit'."""
        return self.name.replace("_", " ")


@dataclass(frozen=True)
class Variable:
    """A state variable: `label` names it in events ("work schedule"), `topic` names it in questions
    from the user's side ("the hours I work").
    """

    name: str
    domain: str
    label: str
    topic: str
    values: tuple[Value, ...]

    def value(self, name: str) -> Value:
        """The value called `name` (KeyError if the variable has no such value)."""
        for value in self.values:
            if value.name == name:
                return value
        raise KeyError(f"{self.name} has no value {name!r}")

    @property
    def value_names(self) -> list[str]:
        """The value strings in catalogue order."""
        return [value.name for value in self.values]


def _v(name: str, advice: str, *renderings: str) -> Value:
    return Value(name=name, renderings=tuple(renderings), advice=advice)


def _domain(domain: str, *specs: tuple[str, str, str, tuple[Value, ...]]) -> list[Variable]:
    return [
        Variable(name=n, domain=domain, label=lab, topic=top, values=vals)
        for n, lab, top, vals in specs
    ]


_WORK = _domain(
    "work",
    (
        "work_arrangement",
        "work arrangement",
        "where I do my work",
        (
            _v(
                "fully_remote",
                "Since you work fully from home, mark the start and end of the workday with a fixed ritual and plan one reason to leave the house each day.",
                "I work entirely from home these days and haven't seen an office in months.",
                "My job is fully remote now, so the desk in my spare room is my whole workplace.",
            ),
            _v(
                "hybrid",
                "With a hybrid week, keep deep solo work for your home days and save meetings and collaboration for the office days.",
                "I split my week between the office and working from home.",
                "These days I'm in the office a couple of days a week and at home the rest.",
            ),
            _v(
                "office_based",
                "Because you are in the office every weekday, prepare things the evening before and protect your lunch break as your main pause.",
                "I'm at the office five days a week now.",
                "My job has me working from the office every single weekday.",
            ),
            _v(
                "on_site_field",
                "As your days are spent at changing job sites, keep a portable kit of essentials and batch your admin into one fixed slot a week.",
                "My work keeps me out at client sites rather than at a desk.",
                "Most of my working day is spent moving between job sites.",
            ),
        ),
    ),
    (
        "work_schedule",
        "work schedule",
        "the hours I work",
        (
            _v(
                "standard_daytime",
                "With regular daytime hours, anchor exercise and errands to early evenings and keep weekends mostly free.",
                "I work regular nine-to-five hours, Monday to Friday.",
                "My working hours are a normal daytime schedule that ends around five.",
            ),
            _v(
                "early_shifts",
                "Because your shifts start very early, move your main meal and wind-down earlier and use the free afternoons for demanding tasks.",
                "My shifts start at 6 a.m. and finish by early afternoon.",
                "I've been put on the early shift at work, starting at six in the morning.",
            ),
            _v(
                "night_shifts",
                "As you work nights, guard one consistent daytime sleep block with blackout curtains and book appointments right after you wake.",
                "I work nights now, usually from 10 p.m. until the morning.",
                "My job has me on the night shift, from late evening until breakfast time.",
            ),
            _v(
                "rotating_shifts",
                "With a rotating roster, plan week by week from the rota and keep a few anchors, like meal times after waking, constant across rotations.",
                "My shifts rotate between days and nights every couple of weeks.",
                "I never keep the same hours for long because my roster keeps rotating.",
            ),
        ),
    ),
    (
        "job_stage",
        "career stage",
        "where I am in my career right now",
        (
            _v(
                "new_in_role",
                "Since you are new in your role, learn the key people and processes first and hold off on extra commitments.",
                "I started a new job only a few weeks ago and I'm still learning the ropes.",
                "I'm brand new in my current role and still figuring out how things work there.",
            ),
            _v(
                "settled_in_role",
                "Being settled in your role, you can afford to put spare energy into a stretch project or a skill outside work.",
                "I've been in the same job for years and know it inside out.",
                "My position at work feels settled and familiar by now.",
            ),
            _v(
                "seeking_promotion",
                "Since you are going for a promotion, make your results visible, ask for feedback early and own one high-impact piece of work.",
                "I'm actively going for a promotion at work this year.",
                "I've told my boss I want to move up to the next level.",
            ),
            _v(
                "job_hunting",
                "While you are job hunting, block regular time for applications and interview practice and keep other commitments light.",
                "I'm looking for a new job and sending out applications.",
                "I've decided to leave my current employer and I'm interviewing elsewhere.",
            ),
        ),
    ),
    (
        "workload_level",
        "workload",
        "how heavy my workload is",
        (
            _v(
                "light_workload",
                "With a light workload, this is a good moment to start something you have been postponing.",
                "Work is pretty quiet for me at the moment, with plenty of slack.",
                "My workload is light right now and I often finish my tasks early.",
            ),
            _v(
                "moderate_workload",
                "With a manageable workload, keep a sustainable rhythm and add new goals one at a time.",
                "My workload is steady and manageable at the moment.",
                "Work keeps me busy, but it's a reasonable amount.",
            ),
            _v(
                "heavy_workload",
                "Given how heavy your workload is, keep new plans minimal, protect your rest and aim only for low-effort wins for now.",
                "I'm swamped at work and regularly stay late to keep up.",
                "My workload has become really heavy, with long days most weeks.",
            ),
        ),
    ),
    (
        "team_role",
        "role in the team",
        "my responsibilities for other people at work",
        (
            _v(
                "individual_contributor",
                "As you have no direct reports, shape your days around long focus blocks for your own work.",
                "I don't manage anyone; I just handle my own tasks.",
                "I work as an individual contributor without any direct reports.",
            ),
            _v(
                "team_lead",
                "Leading a small team, keep quick daily check-ins and delegate routine tasks so your own work keeps moving.",
                "I now lead a small team of four people.",
                "I'm the team lead, coordinating a handful of colleagues day to day.",
            ),
            _v(
                "people_manager",
                "Managing a large group, batch your one-to-ones, delegate decisions clearly and keep one hour a day free of meetings.",
                "I manage several managers, so my calendar is full of one-to-ones.",
                "My role is now about running a whole department of people.",
            ),
        ),
    ),
)

_TRAVEL = _domain(
    "mobility and travel",
    (
        "main_transport",
        "main way of getting around",
        "how I get around",
        (
            _v(
                "car",
                "Since you drive almost everywhere, combine errands into single trips and use the time behind the wheel for podcasts.",
                "I drive everywhere these days.",
                "My car is how I get around for almost everything.",
            ),
            _v(
                "public_transit",
                "Relying on public transport, plan around the timetables, carry something to read and favour places near good connections.",
                "I rely on buses and trains to get around.",
                "I take public transport for nearly all my trips.",
            ),
            _v(
                "bike",
                "Because you cycle most places, keep rain gear and lights ready and plan routes along quieter streets.",
                "I cycle to get around town most days now.",
                "My bike has become my main way of getting from A to B.",
            ),
            _v(
                "on_foot",
                "Getting around on foot, choose shops and services close by and keep comfortable shoes for busy days.",
                "I walk everywhere because everything I need is within walking distance.",
                "I don't use any vehicle and get around on foot.",
            ),
        ),
    ),
    (
        "trip_frequency",
        "travel frequency",
        "how often I travel",
        (
            _v(
                "rarely_travels",
                "As you rarely travel, a short local getaway gives a change of scene without much planning.",
                "I hardly ever travel and stay close to home all year.",
                "It's been ages since I took a trip anywhere.",
            ),
            _v(
                "few_trips_a_year",
                "Taking a few trips a year, book them well ahead for good prices and spread them through the seasons.",
                "I take two or three trips a year.",
                "I go away a few times a year, usually for a long weekend.",
            ),
            _v(
                "monthly_trips",
                "Travelling every month, keep a packed travel kit ready and protect routines you can carry with you.",
                "I'm travelling almost every month at the moment.",
                "I seem to be heading off somewhere nearly every month.",
            ),
        ),
    ),
    (
        "travel_style",
        "travel style",
        "the way I like to travel",
        (
            _v(
                "budget_backpacking",
                "With your budget style of travel, use overnight routes, hostels with kitchens and free walking tours.",
                "When I travel I backpack on a tight budget and stay in hostels.",
                "I'm a budget traveller who always hunts for the cheapest options.",
            ),
            _v(
                "comfortable_mid_range",
                "Preferring mid-range comfort, book well-reviewed central hotels and splurge on one special experience per trip.",
                "I like comfortable mid-range hotels when I travel.",
                "On trips I go for decent, reasonably priced comfort rather than luxury or hostels.",
            ),
            _v(
                "luxury",
                "Since you enjoy luxury travel, use a loyalty programme and the concierge to get the most from premium stays.",
                "I treat myself to five-star hotels and first-class seats when I travel.",
                "I prefer high-end travel with premium service.",
            ),
        ),
    ),
    (
        "preferred_trip_type",
        "favourite kind of trip",
        "the kind of trips I enjoy",
        (
            _v(
                "city_breaks",
                "Since you love city breaks, pick destinations with compact centres and book popular museums in advance.",
                "My favourite trips are city breaks full of museums and restaurants.",
                "I love exploring a new city for a few days.",
            ),
            _v(
                "nature_outdoors",
                "As you prefer nature trips, choose places with good trail networks and pack layers for changing weather.",
                "I'd always rather head to the mountains or forests on a trip.",
                "My ideal holiday is trekking somewhere wild and remote.",
            ),
            _v(
                "beach_relaxation",
                "Since beach holidays suit you, look for quiet coastal spots outside peak season and plan real downtime.",
                "For me a holiday means lying on a beach and doing nothing.",
                "I like slow beach holidays in the sun.",
            ),
            _v(
                "visiting_family",
                "Since your trips are mostly family visits, add a small outing just for you so they also feel like a break.",
                "Most of my trips are to visit relatives in other cities.",
                "I mainly travel to see family who live far away.",
            ),
        ),
    ),
)

_HOUSING = _domain(
    "housing",
    (
        "home_type",
        "type of home",
        "the kind of home I live in",
        (
            _v(
                "studio_apartment",
                "In a studio, use vertical storage and fold-away furniture so one room can serve several purposes.",
                "I live in a small studio apartment.",
                "My whole home is one room plus a tiny bathroom.",
            ),
            _v(
                "family_apartment",
                "With a roomy apartment, give one corner or room a single purpose such as work or hobbies.",
                "I live in a spacious apartment with several bedrooms.",
                "My flat has three bedrooms and a big living room.",
            ),
            _v(
                "house_with_garden",
                "Living in a house with a garden, use the outdoor space for movement or quiet breaks and plan seasonal upkeep.",
                "I live in a house with its own garden.",
                "My home is a detached house with a yard out back.",
            ),
            _v(
                "shared_house",
                "Sharing a house, agree on quiet hours and kitchen slots with your housemates so your routines don't clash.",
                "I share a house with several housemates.",
                "I have my own room in a house shared with other people.",
            ),
        ),
    ),
    (
        "housing_tenure",
        "housing tenure",
        "whether I rent or own my home",
        (
            _v(
                "renting",
                "As a renter, keep some savings for moving costs and ask your landlord before changing anything in the home.",
                "I rent my place from a landlord.",
                "I'm a tenant and pay rent every month.",
            ),
            _v(
                "mortgage",
                "With a mortgage, check whether overpaying or remortgaging makes sense and budget for maintenance.",
                "I bought my home with a mortgage that I'm paying off.",
                "I own my home but still have a mortgage on it.",
            ),
            _v(
                "owned_outright",
                "Owning your home outright, you can redirect what used to go on housing into savings or improvements.",
                "I own my home outright, with no mortgage left.",
                "My home is fully paid off.",
            ),
        ),
    ),
    (
        "neighbourhood",
        "neighbourhood",
        "the area I live in",
        (
            _v(
                "city_centre",
                "Living centrally, make the most of nearby services and find a quiet green spot to escape the noise.",
                "I live right in the city centre.",
                "My home is in the middle of downtown, close to everything.",
            ),
            _v(
                "suburbs",
                "In the suburbs, cluster your trips into town and make use of local parks and community groups.",
                "I live out in the suburbs.",
                "My home is in a quiet suburban area outside the city.",
            ),
            _v(
                "rural",
                "Living rurally, stock up in fewer, bigger shops and build local connections for help and company.",
                "I live in the countryside, miles from the nearest town.",
                "My home is in a small rural village.",
            ),
        ),
    ),
    (
        "moving_plans",
        "moving plans",
        "whether I plan to move",
        (
            _v(
                "staying_put",
                "Since you are staying put, it is worth investing in making your current home work better for you.",
                "I have no plans to move; I'm happy where I am.",
                "I intend to stay in my current home for the foreseeable future.",
            ),
            _v(
                "considering_move",
                "As you are considering a move, list your must-haves and visit a few areas before committing.",
                "I'm starting to think about moving somewhere else.",
                "Lately I've been browsing listings and wondering whether to move.",
            ),
            _v(
                "actively_moving",
                "In the middle of a move, keep a box of essentials at hand and postpone any non-urgent projects.",
                "I'm in the middle of moving house right now.",
                "I've signed for a new place and I'm packing boxes.",
            ),
        ),
    ),
    (
        "home_projects",
        "home improvement projects",
        "the state of projects at home",
        (
            _v(
                "no_projects",
                "With no home projects pending, your weekends are free for rest or hobbies.",
                "There's nothing I need to fix or renovate at home.",
                "My home doesn't need any work at the moment.",
            ),
            _v(
                "minor_repairs",
                "With a few small repairs waiting, tackle one each weekend so they never pile up.",
                "I've got a few small repairs to do around the house.",
                "There are some minor fixes at home I keep meaning to get to.",
            ),
            _v(
                "major_renovation",
                "During a major renovation, keep one dust-free room for rest and plan meals that need little kitchen space.",
                "We're in the middle of a big renovation at home.",
                "My kitchen and bathroom are being completely redone.",
            ),
        ),
    ),
)

_HEALTH = _domain(
    "health and fitness",
    (
        "exercise_routine",
        "exercise routine",
        "how much I exercise",
        (
            _v(
                "sedentary",
                "Starting from little exercise, begin with ten-minute walks after meals and build up gradually.",
                "I barely exercise at all right now.",
                "Honestly, I don't work out and hardly move during the day.",
            ),
            _v(
                "light_activity",
                "With light regular activity, add one slightly harder session a week to keep progressing.",
                "I do light exercise like stretching or gentle yoga a few times a week.",
                "My exercise is mostly easy stuff, such as a bit of yoga.",
            ),
            _v(
                "gym_regular",
                "As a gym regular, plan rest days and vary your programme every few weeks to avoid plateaus.",
                "I go to the gym four times a week for weights.",
                "Lifting at the gym is a fixed part of my week.",
            ),
            _v(
                "endurance_training",
                "With heavy endurance training, prioritise recovery, fuel long sessions well and schedule easy weeks.",
                "I'm training for a marathon and run most days.",
                "I do a lot of endurance training, with long runs and swims every week.",
            ),
        ),
    ),
    (
        "fitness_goal",
        "fitness goal",
        "my fitness goal",
        (
            _v(
                "lose_weight",
                "Aiming to lose weight, focus on a modest daily calorie deficit and activity you can sustain.",
                "My main fitness goal is to lose some weight.",
                "I'm trying to slim down a bit this year.",
            ),
            _v(
                "build_strength",
                "To build strength, follow a progressive plan of compound lifts and eat enough protein.",
                "I want to get noticeably stronger.",
                "My goal right now is building muscle and strength.",
            ),
            _v(
                "improve_endurance",
                "To improve endurance, add steady longer sessions and raise the volume by about ten percent at a time.",
                "I'm working on my stamina so I can keep going longer without tiring.",
                "My goal is to improve my endurance.",
            ),
            _v(
                "stay_mobile",
                "To stay mobile, mix daily stretching with balance work and low-impact movement.",
                "I mostly want to stay flexible and keep my joints moving well.",
                "For me fitness is about staying mobile as I get older.",
            ),
        ),
    ),
    (
        "injury_status",
        "injury status",
        "any injuries I'm dealing with",
        (
            _v(
                "no_injury",
                "Being injury-free, you can train normally; just warm up properly to keep it that way.",
                "I'm not dealing with any injuries at the moment.",
                "Physically I'm injury-free right now.",
            ),
            _v(
                "knee_injury",
                "With a healing knee, avoid jumping and deep squats and favour swimming or a stationary bike.",
                "I'm recovering from a knee injury.",
                "My knee is still healing after I hurt it.",
            ),
            _v(
                "back_pain",
                "With ongoing back pain, build core strength gently, take breaks from sitting and see a physiotherapist if it persists.",
                "I've got ongoing lower back pain.",
                "My back has been hurting for a while now.",
            ),
        ),
    ),
    (
        "sleep_pattern",
        "sleep pattern",
        "my sleep pattern",
        (
            _v(
                "early_riser",
                "As an early riser, put your most demanding tasks in the morning and wind down early in the evening.",
                "I go to bed early and I'm up at five most mornings.",
                "I'm naturally an early bird, awake before sunrise.",
            ),
            _v(
                "night_owl",
                "As a night owl, schedule focused work for the evening where possible and avoid early commitments.",
                "I'm a night owl and rarely sleep before 2 a.m.",
                "My best hours are late at night, and I sleep in whenever I can.",
            ),
            _v(
                "irregular_sleep",
                "With irregular sleep, fix your wake-up time first and keep screens out of the last hour before bed.",
                "My sleep is all over the place, different every night.",
                "I don't have any regular bedtime; some nights I barely sleep.",
            ),
        ),
    ),
    (
        "stress_level",
        "stress level",
        "how stressed I feel",
        (
            _v(
                "low_stress",
                "Since your stress is low, use this calm period to build habits that will help when things get busier.",
                "I'm feeling pretty relaxed these days.",
                "Life feels calm and my stress is low.",
            ),
            _v(
                "moderate_stress",
                "With moderate stress, a short daily decompression routine such as a walk or journaling keeps it in check.",
                "I'm a bit stressed, but it's manageable.",
                "There's some pressure in my life, but I'm coping.",
            ),
            _v(
                "high_stress",
                "Given your high stress, cut optional commitments, lean on people you trust and consider talking to a professional.",
                "I'm extremely stressed and close to burning out.",
                "The stress has become overwhelming lately.",
            ),
        ),
    ),
)

_FOOD = _domain(
    "food and drink",
    (
        "diet_type",
        "diet",
        "what I eat",
        (
            _v(
                "omnivore",
                "Eating a bit of everything, aim for half a plate of vegetables and lean proteins most days.",
                "I eat pretty much everything, meat included.",
                "I'm a meat eater with no dietary rules.",
            ),
            _v(
                "vegetarian",
                "As a vegetarian, make sure you get enough iron and protein from beans, eggs and dairy.",
                "I've gone vegetarian and don't eat meat or fish.",
                "I follow a vegetarian diet now.",
            ),
            _v(
                "vegan",
                "On a vegan diet, take a B12 supplement and combine legumes and grains for complete protein.",
                "I'm fully vegan, no animal products at all.",
                "I eat a strictly plant-based vegan diet.",
            ),
            _v(
                "pescatarian",
                "As a pescatarian, include oily fish twice a week and vary your plant proteins.",
                "I don't eat meat, but I still eat fish.",
                "I'm pescatarian these days.",
            ),
        ),
    ),
    (
        "cooking_habit",
        "cooking habits",
        "how I handle meals",
        (
            _v(
                "cooks_daily",
                "Since you cook daily, plan a weekly menu to cut shopping time and reduce waste.",
                "I cook a fresh meal from scratch every day.",
                "Cooking dinner every evening is part of my routine.",
            ),
            _v(
                "meal_preps",
                "As a meal-prepper, rotate a few recipes to avoid boredom and freeze portions for busy days.",
                "I batch-cook all my meals on Sundays for the week.",
                "I meal-prep in bulk once a week.",
            ),
            _v(
                "mostly_takeaway",
                "Relying mostly on takeaway, pick a few healthier go-to orders and keep simple snacks at home.",
                "I mostly order takeaway instead of cooking.",
                "I rarely cook; delivery apps feed me most nights.",
            ),
        ),
    ),
    (
        "caffeine_intake",
        "caffeine intake",
        "how much caffeine I drink",
        (
            _v(
                "no_caffeine",
                "Being caffeine-free, rely on daylight, movement and regular meals to keep your energy steady.",
                "I've cut out caffeine completely.",
                "I don't drink caffeinated coffee or tea any more.",
            ),
            _v(
                "one_cup",
                "With one morning coffee, keep it before noon and it should not disturb your sleep.",
                "I have a single cup of coffee in the morning.",
                "One coffee a day is my limit.",
            ),
            _v(
                "several_cups",
                "Drinking several coffees a day, taper slowly and stop caffeine by early afternoon to protect sleep.",
                "I get through five or six coffees a day.",
                "I drink a lot of coffee, cup after cup all day.",
            ),
        ),
    ),
    (
        "food_restriction",
        "food intolerance",
        "foods my body can't handle",
        (
            _v(
                "no_restriction",
                "With no food restrictions, you can focus on variety and balance.",
                "My stomach handles every kind of food without trouble.",
                "I have no food allergies or intolerances.",
            ),
            _v(
                "lactose_intolerant",
                "Being lactose intolerant, use lactose-free dairy or fortified alternatives to keep calcium up.",
                "I've found out I'm lactose intolerant.",
                "Dairy upsets my stomach, so I avoid milk.",
            ),
            _v(
                "gluten_free",
                "Avoiding gluten, build meals around rice, potatoes and certified gluten-free oats and check labels carefully.",
                "I have to avoid gluten.",
                "I've been diagnosed with coeliac disease, so no wheat for me.",
            ),
            _v(
                "nut_allergy",
                "With a nut allergy, always carry your medication and ask about ingredients when eating out.",
                "I have a nut allergy.",
                "I'm allergic to peanuts and tree nuts.",
            ),
        ),
    ),
    (
        "alcohol_habit",
        "drinking habits",
        "how much alcohol I drink",
        (
            _v(
                "non_drinker",
                "As a non-drinker, have a favourite alcohol-free option ready for social events.",
                "I don't drink alcohol at all.",
                "I've stopped drinking completely.",
            ),
            _v(
                "occasional_drinker",
                "Drinking occasionally, keep it to social occasions and alternate with water.",
                "I have a glass of wine now and then.",
                "I drink only occasionally, at celebrations.",
            ),
            _v(
                "regular_drinker",
                "With regular drinking, set alcohol-free days each week and notice how it affects your sleep.",
                "I have a few drinks most evenings.",
                "Drinking beer after work has become a daily habit.",
            ),
        ),
    ),
)

_MONEY = _domain(
    "money",
    (
        "income_trend",
        "income situation",
        "my income",
        (
            _v(
                "stable_income",
                "With a steady income, automate saving a fixed share of each pay cheque.",
                "My income is steady and predictable.",
                "I earn about the same every month.",
            ),
            _v(
                "increased_income",
                "After your pay rise, send most of the increase to your goals before your lifestyle absorbs it.",
                "I recently got a big pay rise.",
                "My income has gone up quite a bit.",
            ),
            _v(
                "reduced_income",
                "With a reduced income, trim fixed costs first and keep an emergency buffer untouched.",
                "My income has dropped and money is tighter.",
                "I'm earning noticeably less than before.",
            ),
        ),
    ),
    (
        "savings_goal",
        "savings goal",
        "what I'm saving for",
        (
            _v(
                "emergency_fund",
                "Building an emergency fund, aim for three months of expenses in an easy-access account.",
                "I'm building an emergency fund.",
                "My priority is saving a cushion for unexpected expenses.",
            ),
            _v(
                "house_deposit",
                "Saving for a home deposit, use a dedicated account and look into first-time buyer schemes.",
                "I'm saving for a deposit on a home.",
                "Every spare penny goes toward buying a place of my own.",
            ),
            _v(
                "retirement",
                "Saving for retirement, take any employer match in full and keep costs low with broad funds.",
                "I'm focused on saving for retirement.",
                "My main goal is putting money into my pension.",
            ),
            _v(
                "big_trip",
                "Saving for a big trip, set a target date and move a fixed amount into a travel pot every payday.",
                "I'm saving up for a once-in-a-lifetime trip.",
                "I'm putting money aside for a long holiday abroad.",
            ),
        ),
    ),
    (
        "debt_situation",
        "debts",
        "any debts I have",
        (
            _v(
                "no_consumer_debt",
                "Without consumer debt, you can put your spare money into savings and investing.",
                "I don't owe anything on cards or loans.",
                "I'm free of any consumer debt.",
            ),
            _v(
                "student_loan",
                "With a student loan, keep paying the scheduled amount and favour saving over early repayment unless the rate is high.",
                "I'm still repaying my student loan.",
                "My student loan takes a chunk of my pay each month.",
            ),
            _v(
                "credit_card_debt",
                "With credit card debt, pay it down first, highest interest card first, and avoid new charges.",
                "I've built up credit card debt I'm trying to pay down.",
                "I owe a fair amount on my credit cards.",
            ),
            _v(
                "personal_loan",
                "With a personal loan, keep repayments on schedule and take on no other loan until it is cleared.",
                "I'm paying off a personal loan I took out last year.",
                "I have a personal loan with monthly repayments.",
            ),
        ),
    ),
    (
        "budgeting_style",
        "budgeting approach",
        "how I keep track of money",
        (
            _v(
                "no_budget",
                "Without a budget, start by tracking your spending for one month to see where the money goes.",
                "I don't really track my spending.",
                "I never budget; I just check my balance now and then.",
            ),
            _v(
                "app_tracking",
                "Using a budgeting app, review its categories weekly and set alerts for the ones you overspend.",
                "I track every purchase in a budgeting app.",
                "A budgeting app logs all my spending.",
            ),
            _v(
                "cash_envelopes",
                "With cash envelopes, keep a small buffer envelope for surprises and review the amounts monthly.",
                "I budget with cash in labelled envelopes.",
                "I withdraw cash each week and split it into envelopes for each category.",
            ),
        ),
    ),
    (
        "investment_experience",
        "investing experience",
        "my investing",
        (
            _v(
                "not_investing",
                "New to investing, start with a low-cost index fund once your emergency savings are in place.",
                "I don't have any investments.",
                "I've never invested any money.",
            ),
            _v(
                "index_funds",
                "Investing in index funds, keep contributing regularly and rebalance once a year.",
                "I put money into index funds every month.",
                "I invest passively in broad index funds.",
            ),
            _v(
                "active_trading",
                "Trading actively, cap the amount you trade with and keep the core of your savings in diversified funds.",
                "I actively trade individual stocks.",
                "I buy and sell shares most weeks.",
            ),
        ),
    ),
)

_FAMILY = _domain(
    "family and social life",
    (
        "children_status",
        "children",
        "my situation with kids",
        (
            _v(
                "no_children",
                "Without children to care for, your evenings and weekends are flexible for your own priorities.",
                "I don't have any kids.",
                "There are no children in my life to look after.",
            ),
            _v(
                "expecting_baby",
                "Expecting a baby, get the essentials ready early, sort out parental leave and rest while you can.",
                "We're expecting our first baby.",
                "A baby is on the way in a few months.",
            ),
            _v(
                "young_children",
                "With young children, plan around nap and bedtime routines and accept help when it is offered.",
                "I have two young children under five.",
                "My little ones are toddlers and keep me busy.",
            ),
            _v(
                "teenagers",
                "With teenagers, keep regular one-to-one time with each and hand them more responsibility gradually.",
                "My kids are teenagers now.",
                "I'm raising two teens.",
            ),
        ),
    ),
    (
        "pet_ownership",
        "pets",
        "my pets",
        (
            _v(
                "no_pets",
                "Without pets, you are free to travel and go out without arranging care.",
                "I don't have any pets.",
                "There are no animals in my home.",
            ),
            _v(
                "dog",
                "With a dog, build its walks into your own exercise and find a reliable sitter for busy days.",
                "I have a dog that needs walking twice a day.",
                "I recently adopted a dog.",
            ),
            _v(
                "cat",
                "With a cat, an automatic feeder and a steady litter routine make short absences easy.",
                "I share my home with a cat.",
                "I've got a cat who rules the house.",
            ),
            _v(
                "small_pet",
                "With small pets, keep a weekly cleaning routine and ask a neighbour to feed them when you are away.",
                "I keep a couple of rabbits.",
                "I have a small pet, a pair of guinea pigs.",
            ),
        ),
    ),
    (
        "caregiving_duty",
        "caregiving responsibilities",
        "whether I care for a relative",
        (
            _v(
                "no_caregiving",
                "Without caregiving duties, you can plan your time around your own goals.",
                "I don't have to care for any relatives.",
                "Nobody in my family depends on me for care.",
            ),
            _v(
                "elderly_parent",
                "Caring for an elderly parent, share tasks with siblings or local services and keep a little time each week for yourself.",
                "I look after my elderly mother several times a week.",
                "My father is getting frail and I help him with shopping and appointments.",
            ),
            _v(
                "sick_relative",
                "Caring for a sick relative, keep their appointments in one calendar and ask friends for concrete help like meals.",
                "A close relative of mine is seriously ill and I'm their main carer.",
                "I'm caring for a sibling who is recovering from major surgery.",
            ),
        ),
    ),
    (
        "social_life",
        "social life",
        "how busy my social life is",
        (
            _v(
                "quiet_social_life",
                "With a quiet social life, one small regular commitment, like a weekly class, adds connection without pressure.",
                "My social life is quiet; I mostly keep to myself.",
                "I rarely see friends these days.",
            ),
            _v(
                "balanced_social_life",
                "With a balanced social life, keep your regular meet-ups and leave room for downtime.",
                "I see friends about once a week.",
                "I meet up with people regularly, but not too often.",
            ),
            _v(
                "busy_social_life",
                "With a packed social calendar, schedule nights in to recharge and combine socialising with things you already do.",
                "My social calendar is packed almost every night.",
                "I'm out with friends several evenings a week.",
            ),
        ),
    ),
    (
        "family_contact",
        "contact with family",
        "how often I'm in touch with my family",
        (
            _v(
                "daily_contact",
                "Being in daily contact with family, let them be part of your support and accountability.",
                "I talk to my family every day.",
                "My relatives and I call each other daily.",
            ),
            _v(
                "weekly_contact",
                "With weekly family catch-ups, use them to share plans and ask for help when you need it.",
                "I catch up with my family once a week.",
                "Sunday calls with my family are our weekly ritual.",
            ),
            _v(
                "rare_contact",
                "With little family contact, build a support network of friends or community groups.",
                "I rarely speak to my family.",
                "My family and I hardly keep in touch.",
            ),
        ),
    ),
)

_LEARNING = _domain(
    "learning and growth",
    (
        "study_format",
        "current studies",
        "my studies",
        (
            _v(
                "not_studying",
                "Not studying right now, short free courses are an easy way to test an interest before committing.",
                "I'm not taking any courses right now.",
                "I'm not enrolled in any kind of study at the moment.",
            ),
            _v(
                "online_course",
                "With a self-paced online course, set fixed study slots and small weekly milestones to keep momentum.",
                "I'm doing a self-paced online course.",
                "I study through online modules in my spare time.",
            ),
            _v(
                "evening_classes",
                "With evening classes, prepare simple dinners in advance and review notes on the days in between.",
                "I attend evening classes twice a week.",
                "I go to a college class on two evenings a week.",
            ),
            _v(
                "part_time_degree",
                "On a part-time degree, map the term's deadlines and plan lighter weeks around exams.",
                "I'm enrolled in a part-time degree.",
                "I'm working toward a university degree part-time.",
            ),
        ),
    ),
    (
        "reading_habit",
        "reading habits",
        "how I read",
        (
            _v(
                "rarely_reads",
                "If reading is rare for you, try short essays or listening to books during routine tasks.",
                "I hardly ever read books.",
                "Reading isn't really part of my life.",
            ),
            _v(
                "audiobooks",
                "Listening to audiobooks, use a library app to keep it free and try a slightly faster playback speed.",
                "I listen to audiobooks all the time.",
                "I get through books as audio while doing chores.",
            ),
            _v(
                "paper_books",
                "Reading printed books, join a library or book swap and keep a reading list for the year.",
                "I always have a paperback on the go.",
                "I read printed books every evening.",
            ),
            _v(
                "ebooks",
                "Reading on an e-reader, use highlights and notes and a night mode to protect your sleep.",
                "I read everything on my e-reader.",
                "My e-reader is loaded with books I read each night.",
            ),
        ),
    ),
    (
        "side_project",
        "side project",
        "what I do on the side",
        (
            _v(
                "no_side_project",
                "Without a side project, you have room to pick one that matches your interests, if you want one.",
                "I don't have any side projects.",
                "Outside my main job I don't run anything on the side.",
            ),
            _v(
                "small_business",
                "Running a small business on the side, automate orders and cap the hours you give it each week.",
                "I run a small online shop on the side.",
                "I've started a little business selling handmade goods.",
            ),
            _v(
                "freelance_work",
                "Doing freelance work, agree clear scopes and invoice promptly so it stays manageable next to your job.",
                "I take freelance jobs in my spare time.",
                "I do paid freelance projects on top of my main work.",
            ),
            _v(
                "open_source",
                "Contributing to open source, pick issues that fit short sessions and ask maintainers for feedback.",
                "I contribute to open-source software projects.",
                "I spend spare hours writing code for a community project.",
            ),
        ),
    ),
    (
        "mentorship",
        "mentoring situation",
        "mentoring in my life",
        (
            _v(
                "no_mentor",
                "Without a mentor, reach out to someone a few steps ahead of you for a short monthly chat.",
                "I don't have a mentor.",
                "Nobody is mentoring me at the moment.",
            ),
            _v(
                "has_mentor",
                "With a mentor, bring specific questions to each meeting and report back on what you tried.",
                "I meet a mentor every month for advice.",
                "A senior colleague mentors me regularly.",
            ),
            _v(
                "mentoring_others",
                "Mentoring others, keep regular sessions and use them to sharpen your own thinking too.",
                "I mentor a couple of junior people.",
                "I've become a mentor to two newcomers.",
            ),
        ),
    ),
)

_LEISURE = _domain(
    "leisure",
    (
        "main_hobby",
        "main hobby",
        "my main hobby",
        (
            _v(
                "painting",
                "As a painter, set up a small permanent corner so you can paint in short sessions.",
                "Painting is my main hobby.",
                "I spend my free time painting watercolours.",
            ),
            _v(
                "gardening",
                "As a keen gardener, plan your seasonal tasks and treat gardening as gentle exercise.",
                "I spend most of my free time gardening.",
                "Growing vegetables and flowers is my favourite pastime.",
            ),
            _v(
                "video_games",
                "Since gaming is your hobby, set session limits and try cooperative games to stay social.",
                "I play video games most evenings.",
                "Gaming is how I unwind.",
            ),
            _v(
                "playing_music",
                "As a musician, schedule short daily practice and set a performance goal to stay motivated.",
                "I play the guitar in a band.",
                "Practising the piano is my main hobby.",
            ),
        ),
    ),
    (
        "weekend_activity",
        "typical weekend",
        "how I spend my weekends",
        (
            _v(
                "outdoor_adventures",
                "Spending weekends outdoors, prepare your gear on Friday and keep an indoor plan for bad weather.",
                "My weekends are for hiking and climbing.",
                "I spend most weekends outdoors on adventures.",
            ),
            _v(
                "social_outings",
                "With social weekends, keep one quiet morning so you start the week rested.",
                "Weekends are when I meet people for brunch and events.",
                "I fill my weekends with brunches and parties.",
            ),
            _v(
                "relaxing_at_home",
                "Relaxing at home on weekends, add one small outing for fresh air and a change of scene.",
                "I spend weekends relaxing at home.",
                "My ideal weekend is staying in and doing very little.",
            ),
            _v(
                "family_time",
                "Keeping weekends for family, plan one activity everyone enjoys and share the chores during the week.",
                "Weekends are all about family time for me.",
                "I keep my weekends for family outings.",
            ),
        ),
    ),
    (
        "screen_time",
        "screen time",
        "how much time I spend on screens",
        (
            _v(
                "low_screen_time",
                "With low screen time, keep the habit and use screens deliberately for specific tasks.",
                "I keep my leisure screen time under an hour a day.",
                "I barely use screens in my free time.",
            ),
            _v(
                "moderate_screen_time",
                "With moderate screen time, set a screen-free hour before bed.",
                "I spend a couple of hours a day on screens after work.",
                "My leisure screen time is a few hours a day.",
            ),
            _v(
                "high_screen_time",
                "With very high screen time, use app limits, take a break every hour and keep screens out of the bedroom.",
                "I'm on screens for most of my waking hours.",
                "My screen time reports show over eight hours a day.",
            ),
        ),
    ),
    (
        "volunteering",
        "volunteering",
        "my volunteering",
        (
            _v(
                "not_volunteering",
                "If you are not volunteering, a one-off event is an easy way to try it.",
                "I don't do any volunteering.",
                "I'm not involved with any charity work.",
            ),
            _v(
                "occasional_volunteer",
                "Volunteering occasionally, pick causes close to home so it fits around other plans.",
                "I volunteer at community events now and then.",
                "Every few months I help out at a charity event.",
            ),
            _v(
                "weekly_volunteer",
                "With a weekly volunteering shift, protect that time in your calendar and watch for burnout.",
                "I volunteer every week at the food bank.",
                "A weekly shift at a local shelter is part of my routine.",
            ),
        ),
    ),
    (
        "sports_fandom",
        "sports fandom",
        "the sports I follow",
        (
            _v(
                "not_a_fan",
                "Not following sports, your weekends are free of fixtures to work around.",
                "I don't follow any sports.",
                "Sport on TV doesn't interest me at all.",
            ),
            _v(
                "football_fan",
                "As a football fan, plan chores around fixtures and make matches a social occasion.",
                "I follow football closely and never miss a match.",
                "I'm a season-ticket holder at my football club.",
            ),
            _v(
                "tennis_fan",
                "Following tennis, plan around the big tournaments and maybe pick up a racket yourself.",
                "I watch every tennis tournament I can.",
                "Tennis is the sport I follow religiously.",
            ),
            _v(
                "motorsport_fan",
                "As a motorsport fan, treat race weekends as social events and plan rest around late races.",
                "I'm hooked on Formula 1 races.",
                "I follow motorsport every race weekend.",
            ),
        ),
    ),
)

_TECH = _domain(
    "technology",
    (
        "phone_type",
        "phone",
        "the phone I use",
        (
            _v(
                "android",
                "On Android, use the built-in digital wellbeing tools and a shared calendar app.",
                "I use an Android phone.",
                "My phone runs Android.",
            ),
            _v(
                "iphone",
                "On an iPhone, Screen Time and Focus modes help structure your day.",
                "I have an iPhone.",
                "I switched to an iPhone recently.",
            ),
            _v(
                "basic_phone",
                "With a basic phone, keep a paper planner and use a computer for anything that needs apps.",
                "I use a basic phone that only calls and texts.",
                "I gave up my smartphone for a simple flip phone.",
            ),
        ),
    ),
    (
        "home_internet",
        "home internet",
        "my internet connection at home",
        (
            _v(
                "fibre",
                "With fast fibre, you can rely on cloud backups and video calls.",
                "I have fast fibre broadband at home.",
                "My home internet is a gigabit fibre line.",
            ),
            _v(
                "mobile_data",
                "Relying on mobile data, download big files on other networks and watch your data cap.",
                "I use mobile data as my home internet.",
                "My only internet at home is a 4G hotspot.",
            ),
            _v(
                "slow_connection",
                "With a slow connection, prefer apps that work offline and schedule big downloads overnight.",
                "My internet at home is painfully slow.",
                "I have an old, unreliable connection that keeps dropping out.",
            ),
        ),
    ),
    (
        "computer_setup",
        "computer setup",
        "the computer I use at home",
        (
            _v(
                "laptop_only",
                "Working on one laptop, add a stand and an external keyboard for long sessions.",
                "A single laptop is my only computer.",
                "I do everything on one laptop.",
            ),
            _v(
                "desktop_workstation",
                "With a desktop workstation, set the space up ergonomically and keep it for focused tasks.",
                "I have a powerful desktop PC with two monitors.",
                "My main computer is a desktop workstation.",
            ),
            _v(
                "tablet_only",
                "Using only a tablet, add a keyboard case and rely on cloud apps.",
                "I use only a tablet, no computer.",
                "My tablet has replaced my computer entirely.",
            ),
        ),
    ),
    (
        "smart_home",
        "smart home setup",
        "the smart devices at home",
        (
            _v(
                "no_smart_devices",
                "Without smart devices, simple timers and a written routine do most of the same job.",
                "I don't have any smart home gadgets.",
                "My home has no smart devices at all.",
            ),
            _v(
                "voice_assistant",
                "With a voice assistant, set recurring reminders and routines by voice.",
                "I have a voice assistant speaker in my living room.",
                "I use a smart speaker for timers and reminders.",
            ),
            _v(
                "fully_automated",
                "With a fully automated home, use scheduled scenes to support your evening and morning routines.",
                "My lights, heating and locks are all automated.",
                "My home is fully automated with smart devices.",
            ),
        ),
    ),
    (
        "social_media_use",
        "social media use",
        "how I use social media",
        (
            _v(
                "no_social_media",
                "Off social media, keep in touch with friends through direct messages or calls.",
                "I'm not on social media at all.",
                "I deleted all my social media accounts.",
            ),
            _v(
                "casual_user",
                "As a casual social media user, turn off notifications so scrolling stays a choice.",
                "I scroll social media now and then.",
                "I check social apps casually a few times a day.",
            ),
            _v(
                "content_creator",
                "As a content creator, batch your filming and writing and schedule posts in advance.",
                "I post content for my followers every day.",
                "I run a social media channel with a growing audience.",
            ),
        ),
    ),
)

DOMAINS: dict[str, tuple[Variable, ...]] = {
    group[0].domain: tuple(group)
    for group in (
        _WORK,
        _TRAVEL,
        _HOUSING,
        _HEALTH,
        _FOOD,
        _MONEY,
        _FAMILY,
        _LEARNING,
        _LEISURE,
        _TECH,
    )
}
"""Domain name -> its variables, in catalogue order."""

VARIABLES: dict[str, Variable] = {var.name: var for group in DOMAINS.values() for var in group}
"""Variable name -> variable, across all domains."""


def variable(name: str) -> Variable:
    """The catalogue variable called `name` (KeyError if unknown)."""
    return VARIABLES[name]


def variables_with_values(minimum: int) -> list[Variable]:
    """Variables offering at least `minimum` values, sorted by name (deterministic sampling pool)."""
    return sorted(
        (var for var in VARIABLES.values() if len(var.values) >= minimum), key=lambda var: var.name
    )


def max_values_per_variable() -> int:
    """The largest number of values any catalogue variable offers."""
    return max(len(var.values) for var in VARIABLES.values())
